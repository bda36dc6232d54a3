package damper_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
	"github.com/damper-ai/damper-go/fleet"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// recordingStore is MemoryStore with every part wrapped to count its
// operations, and what New asked of it recorded.
type recordingStore struct {
	fleet.MemoryStore
	keepInMemory bool  // every method returns nil
	fail         error // New's questions fail with it
	partErr      error // every operation of the parts made fails with it (and still decides)

	mu       sync.Mutex
	asked    []string
	budget   fleet.BudgetSettings
	throttle fleet.ThrottleSettings
	breaker  fleet.BreakerSettings
	groups   []fleet.LimitSettings
	ops      map[string]int
}

func (s *recordingStore) count(op string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ops == nil {
		s.ops = map[string]int{}
	}
	s.ops[op]++
	return s.partErr
}

func (s *recordingStore) opCount(op string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ops[op]
}

func (s *recordingStore) ask(part string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked = append(s.asked, part)
}

func (s *recordingStore) Budget(b fleet.BudgetSettings) (fleet.Budget, error) {
	s.ask("budget")
	s.budget = b
	if s.fail != nil || s.keepInMemory {
		return nil, s.fail
	}
	return s.MemoryStore.Budget(b)
}

func (s *recordingStore) Throttle(p fleet.ThrottleSettings) (fleet.Throttle, error) {
	s.ask("throttle")
	s.throttle = p
	if s.fail != nil || s.keepInMemory {
		return nil, s.fail
	}
	t, err := s.MemoryStore.Throttle(p)
	return countedThrottle{t, s}, err
}

func (s *recordingStore) Breaker(b fleet.BreakerSettings) (fleet.Breaker, error) {
	s.ask("breaker")
	s.breaker = b
	if s.fail != nil || s.keepInMemory {
		return nil, s.fail
	}
	br, err := s.MemoryStore.Breaker(b)
	return countedBreaker{br, s}, err
}

func (s *recordingStore) LimitBuckets(l fleet.LimitSettings) (fleet.LimitBuckets, error) {
	s.ask("buckets " + l.Group)
	s.mu.Lock()
	s.groups = append(s.groups, l)
	s.mu.Unlock()
	if s.fail != nil || s.keepInMemory {
		return nil, s.fail
	}
	b, err := s.MemoryStore.LimitBuckets(l)
	return countedBuckets{b, s}, err
}

type countedThrottle struct {
	fleet.Throttle
	s *recordingStore
}

func (c countedThrottle) Add(ctx context.Context, delta int64) error {
	return errors.Join(c.Throttle.Add(ctx, delta), c.s.count("throttle.add"))
}

func (c countedThrottle) Tokens(ctx context.Context) (int64, error) {
	n, err := c.Throttle.Tokens(ctx)
	return n, errors.Join(err, c.s.count("throttle.tokens"))
}

type countedBreaker struct {
	fleet.Breaker
	s *recordingStore
}

func (c countedBreaker) Allow(ctx context.Context, now time.Time) (fleet.CircuitAdmission, error) {
	a, err := c.Breaker.Allow(ctx, now)
	return a, errors.Join(err, c.s.count("breaker.allow"))
}

func (c countedBreaker) Done(ctx context.Context, t fleet.CircuitTicket, now time.Time, v fleet.CircuitVerdict) error {
	return errors.Join(c.Breaker.Done(ctx, t, now, v), c.s.count("breaker.done"))
}

type countedBuckets struct {
	fleet.LimitBuckets
	s *recordingStore
}

func (c countedBuckets) Reserve(ctx context.Context, now time.Time, cost fleet.RateAmounts, p damper.Priority, latest time.Time, t *fleet.RateTicket) (fleet.RateReservation, time.Time, error) {
	r, due, err := c.LimitBuckets.Reserve(ctx, now, cost, p, latest, t)
	return r, due, errors.Join(err, c.s.count("buckets.reserve"))
}

func (c countedBuckets) Settle(ctx context.Context, now time.Time, r fleet.RateReservation, used fleet.RateAmounts, known [3]bool) error {
	return errors.Join(c.LimitBuckets.Settle(ctx, now, r, used, known), c.s.count("buckets.settle"))
}

// storePolicy configures every part a Store may keep.
func storePolicy() damper.Policy {
	return damper.Policy{Breaker: &damper.BreakerPolicy{}, Throttle: &damper.ThrottlePolicy{}, RateLimit: &damper.RateLimitPolicy{}}
}

// New asks the store for each part its Policy configures, with the
// Policy's values and defaults, and the calls go through the parts made.
func TestWithStoreMakesEveryPart(t *testing.T) {
	s := &recordingStore{}
	var changes []damper.CircuitChange
	p := storePolicy()
	p.Breaker.OnStateChange = func(c damper.CircuitChange) { changes = append(changes, c) }
	p.PerAttemptTimeout = 7 * time.Second
	r := newRig(t, p, damper.WithStore(s))
	if got := strings.Join(s.asked, ","); got != "budget,breaker,throttle" {
		t.Fatalf("New asked for %s; want budget,breaker,throttle", got)
	}
	if s.budget != (fleet.BudgetSettings{Ratio: 0.1, Window: time.Minute, MinTokens: 10}) {
		t.Errorf("budget settings %+v", s.budget)
	}
	if s.throttle != (fleet.ThrottleSettings{MaxTokens: 10, TokenRatio: 0.2}) {
		t.Errorf("throttle settings %+v", s.throttle)
	}
	b := s.breaker
	if b.FailureRatio != 0.5 || b.MinAttempts != 20 || b.Window != 30*time.Second || b.OpenFor != 30*time.Second ||
		b.MaxOpenFor != 300*time.Second || b.ProbeLimit != 7*time.Second || b.OnChange == nil {
		t.Errorf("breaker settings %+v", b)
	}

	r.srv.Script("", dampertest.Status(529), dampertest.OK())
	var rep damper.Report
	if _, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep)); err != nil || rep.Attempts != 2 {
		t.Fatalf("err %v, %d attempts; want a retried success", err, rep.Attempts)
	}
	if _, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-5-20250929")); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(s.asked, ","); got != "budget,breaker,throttle,buckets claude-sonnet-4" {
		t.Fatalf("asked %s; want the group's buckets once, at its first call", got)
	}
	if g := s.groups[0]; g.BatchShare != 0.8 || g.Limits != (damper.RateLimits{}) {
		t.Errorf("limit settings %+v", g)
	}
	// Three attempts: each admitted by the breaker and the buckets, and
	// settled with both; the throttle hears the 529 and both answers, and
	// is asked once, for the retry.
	for op, want := range map[string]int{"breaker.allow": 3, "breaker.done": 3, "buckets.reserve": 3, "buckets.settle": 3, "throttle.add": 3, "throttle.tokens": 1} {
		if got := s.opCount(op); got != want {
			t.Errorf("%s: %d, want %d", op, got, want)
		}
	}
	// The store's breaker tells its changes to OnChange, which reaches the
	// policy's callback.
	s.breaker.OnChange(damper.CircuitChange{From: fleet.CircuitClosed, To: fleet.CircuitOpen})
	if len(changes) != 1 || changes[0].To != fleet.CircuitOpen {
		t.Errorf("OnStateChange heard %+v", changes)
	}
}

// Only the parts the Policy configures are asked for; WithBudget
// overrides the store's budget; nil parts stay in memory and work.
func TestWithStoreAsksOnlyWhatIsConfigured(t *testing.T) {
	s := &recordingStore{}
	newRig(t, damper.Policy{}, damper.WithStore(s))
	if got := strings.Join(s.asked, ","); got != "budget" {
		t.Errorf("asked %s; want budget", got)
	}
	s = &recordingStore{}
	b := mustBudget(t, 0.1, time.Minute, 10)
	r := newRig(t, damper.Policy{Throttle: &damper.ThrottlePolicy{}}, damper.WithStore(s), damper.WithBudget(b))
	if got := strings.Join(s.asked, ","); got != "throttle" || r.d.Budget() != b {
		t.Errorf("asked %s; want throttle alone, WithBudget's budget kept", got)
	}

	s = &recordingStore{keepInMemory: true}
	r = newRig(t, storePolicy(), damper.WithStore(s))
	r.srv.Script("", dampertest.Status(529), dampertest.OK())
	var rep damper.Report
	if _, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep)); err != nil || rep.Attempts != 2 {
		t.Fatalf("parts kept in memory: err %v, %d attempts; want a retried success", err, rep.Attempts)
	}
	if _, ok := r.d.Budget().(*fleet.WindowBudget); !ok {
		t.Errorf("budget %T, want the WindowBudget", r.d.Budget())
	}
}

// budgetOnly shares the budget alone: it implements fleet.Store and no
// other part's interface.
type budgetOnly struct{ s *recordingStore }

func (b budgetOnly) Budget(st fleet.BudgetSettings) (fleet.Budget, error) { return b.s.Budget(st) }

// A store that implements no other part's interface keeps those parts in
// memory: New asks it for the budget alone, and the calls go through the
// breaker, throttle and limiter in memory.
func TestStoreOfTheBudgetAlone(t *testing.T) {
	s := &recordingStore{}
	r := newRig(t, storePolicy(), damper.WithStore(budgetOnly{s}))
	r.srv.Script("", dampertest.Status(529), dampertest.OK())
	var rep damper.Report
	if _, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep)); err != nil || rep.Attempts != 2 {
		t.Fatalf("err %v, %d attempts; want a retried success", err, rep.Attempts)
	}
	if got := strings.Join(s.asked, ","); got != "budget" {
		t.Errorf("asked %s; want budget alone", got)
	}
	if n := len(r.d.RateLimits()); n != 3 {
		t.Errorf("%d buckets in memory, want the group's 3", n)
	}
}

// A store that cannot make a part fails New with an error that names the
// part; WithStore(nil) is refused.
func TestWithStoreErrors(t *testing.T) {
	boom := errors.New("redis: connection refused")
	_, err := damper.New(damper.Policy{}, damper.WithStore(&recordingStore{fail: boom}))
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "damper: the store's Budget: ") {
		t.Errorf("err = %v; want the budget's error, named", err)
	}
	_, err = damper.New(damper.Policy{Breaker: &damper.BreakerPolicy{}}, damper.WithStore(&failingPart{recordingStore: &recordingStore{}, part: "breaker", err: boom}))
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "damper: the store's Breaker: ") {
		t.Errorf("err = %v; want the breaker's error, named", err)
	}
	if _, err := damper.New(damper.Policy{}, damper.WithStore(nil)); err == nil || !strings.Contains(err.Error(), "WithStore(nil)") {
		t.Errorf("WithStore(nil): err = %v", err)
	}
}

// failingPart fails one part's making.
type failingPart struct {
	*recordingStore
	part string
	err  error
}

func (f *failingPart) Breaker(b fleet.BreakerSettings) (fleet.Breaker, error) {
	if f.part == "breaker" {
		return nil, f.err
	}
	return f.recordingStore.Breaker(b)
}

// A part whose store fails still decides; Damper follows the decision and
// logs each part's errors apart, one line per ten seconds with the count.
func TestStorePartErrorsAreLoggedPerPart(t *testing.T) {
	boom := errors.New("store: i/o timeout")
	s := &recordingStore{partErr: boom}
	var logs bytes.Buffer
	r := newRig(t, storePolicy(), damper.WithStore(s), damper.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
	call := func() {
		t.Helper()
		r.srv.Script("", dampertest.Status(529), dampertest.OK())
		var rep damper.Report
		if _, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep)); err != nil || rep.Attempts != 2 {
			t.Fatalf("err %v, %d attempts; want a retried success: the parts still decide", err, rep.Attempts)
		}
	}
	lines := func(msg string) []string {
		var out []string
		for l := range strings.Lines(logs.String()) {
			if strings.Contains(l, `"msg":"`+msg+`"`) {
				out = append(out, l)
			}
		}
		return out
	}
	call()
	r.clock.Advance(5 * time.Second)
	call()
	for _, msg := range []string{"damper: circuit breaker store error", "damper: retry throttle store error", "damper: rate limiter store error"} {
		if got := lines(msg); len(got) != 1 || !strings.Contains(got[0], `"errors":1`) {
			t.Errorf("%s: lines %q; want one, with errors 1", msg, got)
		}
	}
	r.clock.Advance(10 * time.Second)
	call()
	// The breaker failed Allow and Done of each attempt: three operations
	// after the first line in the first call, four in the second, and this
	// call's first Allow.
	if got := lines("damper: circuit breaker store error"); len(got) != 2 || !strings.Contains(got[1], `"op":"allow"`) || !strings.Contains(got[1], `"errors":8`) {
		t.Errorf("breaker lines %q; want a second with op allow and errors 8", got)
	}
}

// Every failed operation of a part's store is counted in
// damper.store.errors, by part and operation, whether or not a logger
// hears of it: a fleet whose Redis is down shows it in its metrics.
func TestStorePartErrorsAreCounted(t *testing.T) {
	s := &recordingStore{partErr: errors.New("store: i/o timeout")}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	r := newRig(t, storePolicy(), damper.WithStore(s), damper.WithMeterProvider(mp), damper.WithName("fleet"))
	for range 2 {
		r.srv.Script("", dampertest.Status(529), dampertest.OK())
		if _, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6")); err != nil {
			t.Fatal(err)
		}
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "damper.store.errors" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				part, _ := dp.Attributes.Value("damper.store.part")
				op, _ := dp.Attributes.Value("damper.store.op")
				if name, _ := dp.Attributes.Value("damper.name"); name.AsString() != "fleet" {
					t.Errorf("damper.name = %q, want fleet", name.AsString())
				}
				got[part.AsString()+"."+op.AsString()] += int(dp.Value)
			}
		}
	}
	// Each part's failed operations, as the store counted them.
	want := map[string]int{}
	s.mu.Lock()
	for op, n := range s.ops {
		part, name, _ := strings.Cut(op, ".")
		if part == "buckets" {
			part = "limiter"
		}
		want[part+"."+name] += n
	}
	s.mu.Unlock()
	if len(want) == 0 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("damper.store.errors = %v, want the failed operations %v", got, want)
	}
}

// callNotes keeps a note of each call, as a store across a network would,
// and counts the operations of its parts under each note.
type callNotes struct {
	mu   sync.Mutex
	made int          // notes made, one per call
	ops  map[*int]int // operations per note
	bare int          // operations without a note
}

type callNoteKey struct{ n *callNotes }

func (n *callNotes) CallContext(ctx context.Context) context.Context {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.made++
	return context.WithValue(ctx, callNoteKey{n}, new(int))
}

func (n *callNotes) op(ctx context.Context) {
	note, _ := ctx.Value(callNoteKey{n}).(*int)
	n.mu.Lock()
	defer n.mu.Unlock()
	if note == nil {
		n.bare++
		return
	}
	if n.ops == nil {
		n.ops = map[*int]int{}
	}
	n.ops[note]++
}

func (n *callNotes) check(t *testing.T, what string, calls int) {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.made != calls || len(n.ops) != calls || n.bare != 0 {
		t.Errorf("%s: %d notes made, operations under %d of them, %d without one; want %d, %d and 0", what, n.made, len(n.ops), n.bare, calls, calls)
	}
}

// notingStore is MemoryStore whose parts count their operations by call.
type notingStore struct {
	fleet.MemoryStore
	*callNotes
}

func (s notingStore) Breaker(b fleet.BreakerSettings) (fleet.Breaker, error) {
	br, err := s.MemoryStore.Breaker(b)
	return notedBreaker{br, s.callNotes}, err
}

func (s notingStore) Throttle(p fleet.ThrottleSettings) (fleet.Throttle, error) {
	t, err := s.MemoryStore.Throttle(p)
	return notedThrottle{t, s.callNotes}, err
}

func (s notingStore) LimitBuckets(l fleet.LimitSettings) (fleet.LimitBuckets, error) {
	b, err := s.MemoryStore.LimitBuckets(l)
	return notedBuckets{b, s.callNotes}, err
}

type notedBudget struct {
	fleet.Budget
	n *callNotes
}

func (b notedBudget) Observe(ctx context.Context, now time.Time, a fleet.AttemptOutcome) error {
	b.n.op(ctx)
	return b.Budget.Observe(ctx, now, a)
}

func (b notedBudget) Acquire(ctx context.Context, now time.Time) (bool, error) {
	b.n.op(ctx)
	return b.Budget.Acquire(ctx, now)
}

func (b notedBudget) Available(ctx context.Context, now time.Time) (float64, error) {
	b.n.op(ctx)
	return b.Budget.Available(ctx, now)
}

type notedBreaker struct {
	fleet.Breaker
	n *callNotes
}

func (b notedBreaker) Allow(ctx context.Context, now time.Time) (fleet.CircuitAdmission, error) {
	b.n.op(ctx)
	return b.Breaker.Allow(ctx, now)
}

func (b notedBreaker) RefusesAt(ctx context.Context, now, at time.Time) (bool, time.Time, error) {
	b.n.op(ctx)
	return b.Breaker.RefusesAt(ctx, now, at)
}

func (b notedBreaker) Done(ctx context.Context, t fleet.CircuitTicket, now time.Time, v fleet.CircuitVerdict) error {
	b.n.op(ctx)
	return b.Breaker.Done(ctx, t, now, v)
}

func (b notedBreaker) State(ctx context.Context, now time.Time) (damper.CircuitState, error) {
	b.n.op(ctx)
	return b.Breaker.State(ctx, now)
}

type notedThrottle struct {
	fleet.Throttle
	n *callNotes
}

func (t notedThrottle) Add(ctx context.Context, delta int64) error {
	t.n.op(ctx)
	return t.Throttle.Add(ctx, delta)
}

func (t notedThrottle) Tokens(ctx context.Context) (int64, error) {
	t.n.op(ctx)
	return t.Throttle.Tokens(ctx)
}

type notedBuckets struct {
	fleet.LimitBuckets
	n *callNotes
}

func (b notedBuckets) Reserve(ctx context.Context, now time.Time, cost fleet.RateAmounts, p damper.Priority, latest time.Time, t *fleet.RateTicket) (fleet.RateReservation, time.Time, error) {
	b.n.op(ctx)
	return b.LimitBuckets.Reserve(ctx, now, cost, p, latest, t)
}

func (b notedBuckets) Admits(ctx context.Context, now, at time.Time, cost fleet.RateAmounts, p damper.Priority) (time.Time, error) {
	b.n.op(ctx)
	return b.LimitBuckets.Admits(ctx, now, at, cost, p)
}

func (b notedBuckets) Observe(ctx context.Context, now time.Time, r fleet.RateReservation, o fleet.RateObservation) error {
	b.n.op(ctx)
	return b.LimitBuckets.Observe(ctx, now, r, o)
}

func (b notedBuckets) Settle(ctx context.Context, now time.Time, r fleet.RateReservation, used fleet.RateAmounts, known [3]bool) error {
	b.n.op(ctx)
	return b.LimitBuckets.Settle(ctx, now, r, used, known)
}

func (b notedBuckets) PausedUntil(ctx context.Context, now time.Time) (time.Time, error) {
	b.n.op(ctx)
	return b.LimitBuckets.PausedUntil(ctx, now)
}

func (b notedBuckets) Pause(ctx context.Context, now time.Time, named [3]bool, until time.Time) error {
	b.n.op(ctx)
	return b.LimitBuckets.Pause(ctx, now, named, until)
}

// A store, or a budget given to WithBudget, that keeps a note of each call
// gets every call's context once, and every operation of its parts in the
// call gets the context it returned.
func TestCallContexter(t *testing.T) {
	s := notingStore{callNotes: &callNotes{}}
	b := struct {
		notedBudget
		*callNotes
	}{callNotes: &callNotes{}}
	b.notedBudget = notedBudget{mustBudget(t, 0.1, time.Minute, 10), b.callNotes}
	r := newRig(t, storePolicy(), damper.WithStore(s), damper.WithBudget(b))
	// A retried call, a plain one with its report read, and a stream.
	r.srv.Script("", dampertest.Status(529), dampertest.OK())
	var rep damper.Report
	if _, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep)); err != nil || rep.Attempts != 2 {
		t.Fatalf("err %v, %d attempts; want a retried success", err, rep.Attempts)
	}
	if _, err := r.client.Messages.New(context.Background(), params("claude-sonnet-4-6"), damper.ReportInto(&rep)); err != nil {
		t.Fatal(err)
	}
	stream := r.client.Messages.NewStreaming(context.Background(), params("claude-sonnet-4-6"))
	for stream.Next() {
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	s.check(t, "the store", 3)
	b.check(t, "the budget", 3)
}

// The test stores share every part.
var (
	_ fleet.ThrottleStore = (*recordingStore)(nil)
	_ fleet.BreakerStore  = (*recordingStore)(nil)
	_ fleet.LimitStore    = (*recordingStore)(nil)
	_ fleet.ThrottleStore = notingStore{}
	_ fleet.BreakerStore  = notingStore{}
	_ fleet.LimitStore    = notingStore{}
)
