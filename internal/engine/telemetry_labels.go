package engine

import (
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/damper-ai/damper-go/internal/core"
)

// A caller names any model it likes, and the limit group follows from the
// model, so neither may become a metric series, a span attribute or a log
// field as it came: a metric attribute takes its value from a bounded set
// (labelSet.label), and a span attribute or a log field takes a bounded,
// valid text (BoundedText).
const (
	// maxLabels is the number of models a Damper's metrics name besides
	// those it knows (its price table's): the first seen. Models priced by
	// the table's families fill a second set of maxLabels of their own, so
	// that a caller naming unknown models cannot crowd real ones out. The
	// series that name them are bounded apart (maxModelSeries).
	maxLabels = 32
	// maxGroupLabels is the same for limit groups, besides those it knows
	// (its price table's models', its rate limiter's configured ones).
	// Each group is a series of damper.ratelimit.wait, some 3 KB of a
	// Prometheus scrape, and six of the limiter's gauges: a service's
	// models fall in a few groups, and those of its price table are known.
	maxGroupLabels = 8
	// maxLabelBytes bounds a model or a group as a label or a log field:
	// model IDs are far shorter.
	maxLabelBytes = core.MaxLabelBytes
	// otherLabel is the label of every model or group beyond the bound,
	// and of one that is not valid UTF-8 or longer than maxLabelBytes,
	// which cannot be a model ID.
	otherLabel = core.OtherLabel
)

// labelSet turns models (or limit groups) into the values of metric
// attributes: a value known from the configuration is its own label; any
// other value is its own label if it is among the first max seen of its
// pool, else otherLabel. It is safe for concurrent use; reading a label
// already given takes no lock and allocates nothing.
type labelSet struct {
	known map[string]string // each known value to itself, the label held
	// priced, when set, says which values go to the second pool.
	priced func(string) bool
	max    int // values admitted per pool

	seen atomic.Pointer[map[string]string] // admitted values; copied on write
	full [2]atomic.Bool                    // whether each pool holds max

	mu sync.Mutex // serializes admissions
	n  [2]int     // values admitted per pool; requires mu
}

// newLabelSet returns a set in which the values of known are always their
// own labels, the values priced says yes to have a pool of their own, and
// each pool admits max values.
func newLabelSet(known []string, priced func(string) bool, max int) *labelSet {
	s := &labelSet{known: make(map[string]string, len(known)), priced: priced, max: max}
	for _, k := range known {
		if len(k) <= maxLabelBytes && utf8.ValidString(k) {
			s.known[k] = k
		}
	}
	s.seen.Store(&map[string]string{})
	return s
}

// label returns the metric attribute value of v: v itself (a copy, so that
// a series never holds the buffer v came from), or otherLabel; "" for "".
func (s *labelSet) label(v string) string {
	if v == "" {
		return ""
	}
	if len(v) > maxLabelBytes {
		return otherLabel
	}
	if l, ok := s.known[v]; ok {
		return l
	}
	if l, ok := (*s.seen.Load())[v]; ok {
		return l
	}
	if !utf8.ValidString(v) {
		return otherLabel
	}
	pool := s.pool(v)
	if s.full[pool].Load() {
		return otherLabel
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := *s.seen.Load()
	if l, ok := seen[v]; ok {
		return l
	}
	if s.n[pool] >= s.max {
		return otherLabel
	}
	l := strings.Clone(v)
	grown := make(map[string]string, len(seen)+1)
	for k, x := range seen {
		grown[k] = x
	}
	grown[l] = l
	s.seen.Store(&grown)
	s.n[pool]++
	s.full[pool].Store(s.n[pool] >= s.max)
	return l
}

// pool returns the pool of v: 1 for a value priced says yes to, else 0.
func (s *labelSet) pool(v string) int {
	if s.priced != nil && s.priced(v) {
		return 1
	}
	return 0
}

// seriesSet bounds the combinations of labels that a caller or an upstream
// names. Each label is bounded on its own (labelSet), but a series is a
// combination, and a product of bounded labels, a model by a server by an
// error type, is still large: a histogram's series is some 17 lines of a
// Prometheus scrape. A seriesSet admits the first max combinations of each
// pool; a combination it does not admit is recorded with its caller-named
// labels replaced by otherLabel. It is safe for concurrent use; a
// combination already admitted takes no lock and allocates nothing.
type seriesSet[K comparable] struct {
	max  int
	seen atomic.Pointer[map[K]struct{}] // admitted keys; copied on write
	full [2]atomic.Bool

	mu sync.Mutex // serializes admissions
	n  [2]int     // keys admitted per pool; requires mu
}

func newSeriesSet[K comparable](max int) *seriesSet[K] {
	s := &seriesSet[K]{max: max}
	s.seen.Store(&map[K]struct{}{})
	return s
}

// admit reports whether k has a series of its own: it is among the first
// max keys of its pool.
func (s *seriesSet[K]) admit(k K, pool int) bool {
	if _, ok := (*s.seen.Load())[k]; ok {
		return true
	}
	if s.full[pool].Load() {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := *s.seen.Load()
	if _, ok := seen[k]; ok {
		return true
	}
	if s.n[pool] >= s.max {
		return false
	}
	grown := make(map[K]struct{}, len(seen)+1)
	for x := range seen {
		grown[x] = struct{}{}
	}
	grown[k] = struct{}{}
	s.seen.Store(&grown)
	s.n[pool]++
	s.full[pool].Store(s.n[pool] >= s.max)
	return true
}

// BoundedText returns v as a span attribute or a log field may carry it
// (core.BoundedText).
func BoundedText(v string) string { return core.BoundedText(v) }

// cutText returns v as valid UTF-8 of at most most bytes (core.CutText).
func cutText(v string, most int) string { return core.CutText(v, most) }
