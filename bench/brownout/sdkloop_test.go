package brownout

import (
	"context"
	"math/rand/v2"
	"net/http"
	"testing"
	"testing/synctest"
	"time"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestSDKLoopMatchesSDK runs the SDK's own retry loop (in a synctest
// bubble, where its wall-clock waits are virtual) against a provider that
// always answers 529, and checks that the re-implementation used by the
// sdk-default contender makes the same attempts with waits in the same
// ranges.
func TestSDKLoopMatchesSDK(t *testing.T) {
	var real []time.Time
	synctest.Test(t, func(t *testing.T) {
		rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			real = append(real, time.Now())
			return httpResponse(r, response{status: 529, errType: "overloaded_error"}), nil
		})
		client := newSDKClient(rt)
		if _, err := client.Messages.New(context.Background(), messageParams); err == nil {
			t.Fatal("SDK call against a 529-only provider succeeded")
		}
	})
	if len(real) != 3 {
		t.Fatalf("the SDK made %d attempts, want 3", len(real))
	}
	ranges := [][2]time.Duration{{375 * time.Millisecond, 500 * time.Millisecond}, {750 * time.Millisecond, time.Second}}
	for i, r := range ranges {
		if got := real[i+1].Sub(real[i]); got < r[0] || got > r[1] {
			t.Errorf("SDK wait before retry %d = %v, want in [%v, %v]", i+1, got, r[0], r[1])
		}
	}

	rng := rand.New(rand.NewPCG(1, 2))
	for retry, r := range ranges {
		lo, hi := time.Duration(1<<62), time.Duration(0)
		for range 10000 {
			d := sdkRetryDelay(nil, retry, rng, time.Time{})
			lo, hi = min(lo, d), max(hi, d)
		}
		if lo < r[0] || hi > r[1] || hi-lo < (r[1]-r[0])*9/10 {
			t.Errorf("re-implemented wait before retry %d spans [%v, %v], want [%v, %v]", retry+1, lo, hi, r[0], r[1])
		}
	}
	h := http.Header{}
	h.Set("Retry-After", "2")
	if got := sdkRetryDelay(&http.Response{Header: h}, 0, rng, time.Time{}); got != 2*time.Second {
		t.Errorf("wait with retry-after: 2 = %v, want 2s", got)
	}

	sc := Scenarios(1)[0]
	sc.Provider.Incident = Incident{Kind: Outage, Start: 0, Length: time.Hour}
	sc.Duration = time.Second
	r, err := Run(sc, SDKDefault())
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range r.Requests {
		if q.Attempts != 3 || q.OK {
			t.Fatalf("sdk-default contender: %+v, want 3 failed attempts like the SDK", q)
		}
	}
}
