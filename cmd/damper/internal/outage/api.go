package outage

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/damper-ai/damper-go/dampertest"
)

// requestHeader names the logical request an attempt belongs to, so that the
// fake API can fail each logical request a set number of times however many
// attempts the client spends on it.
const requestHeader = "X-Outage-Request"

// overloaded and answer are the two bodies the fake API sends, shaped like
// the Messages API's.
var (
	overloaded = []byte(`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)
	answer     = []byte(`{"id":"msg_outage","type":"message","role":"assistant","model":"claude-sonnet-5-5",` +
		`"content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","stop_sequence":null,` +
		`"usage":{"input_tokens":10,"output_tokens":1}}`)
)

// api is the fake Messages API of one run: the first failures attempts of
// every logical request get 529, the next one 200. It is safe for
// concurrent use.
type api struct {
	failures int
	clock    *dampertest.Clock
	start    time.Time

	mu    sync.Mutex
	seen  map[string]int  // attempts per logical request
	times []time.Duration // arrival of every attempt, since start
}

func newAPI(failures int, clock *dampertest.Clock) *api {
	return &api{failures: failures, clock: clock, start: clock.Now(), seen: map[string]int{}}
}

func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(requestHeader)
	a.mu.Lock()
	a.seen[id]++
	n := a.seen[id]
	a.times = append(a.times, a.clock.Now().Sub(a.start))
	a.mu.Unlock()

	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Request-Id", "req_outage_"+id+"_"+strconv.Itoa(n))
	if n <= a.failures {
		w.WriteHeader(529)
		w.Write(overloaded)
		return
	}
	w.Write(answer)
}

// attempts returns the number of attempts received and their arrival times.
func (a *api) attempts() (int, []time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.times), append([]time.Duration(nil), a.times...)
}
