package fleettest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
)

func (e *env) shares(t *testing.T) {
	t.Run("Settings", func(t *testing.T) {
		_, err := e.new(t).(fleet.ShareStore).LimitShares(fleet.ShareSettings{})
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), "group") {
			t.Errorf("LimitShares with no group: error %v, want one naming the group", err)
		}
	})
	t.Run("Arithmetic", e.sharesArithmetic)
	t.Run("BadAsks", e.sharesBadAsks)
}

func newShares(t *testing.T, s fleet.Store) fleet.LimitShares {
	t.Helper()
	sh, err := s.(fleet.ShareStore).LimitShares(fleet.ShareSettings{Group: "conformance"})
	if err != nil || sh == nil {
		t.Fatalf("LimitShares = %v, %v; want shares", sh, err)
	}
	return sh
}

// shareStep is one ask of the arithmetic, at Base+at, or, with settle
// set, the settling of the reservation of step settle-1 by used.
type shareStep struct {
	at      time.Duration
	tenant  string
	weight  int
	f       float64
	wait    time.Duration // latest is now + wait
	settle  int
	used    float64
	taken   bool
	due     time.Duration // when not taken, from Base
	comment string
}

// shareSteps: alpha (weight 3) alone has the whole limit, and waits once
// its bucket is below 0; beta (weight 1) joining makes alpha's share 3/4;
// beta idle for more than TenantIdle is dropped, and alpha has it all
// again; beta back starts full; a settling gives back what was not used;
// a weight changed changes the share at once.
var shareSteps = []shareStep{
	{at: 0, tenant: "alpha", weight: 3, f: 0.5, wait: time.Minute, taken: true, comment: "new: full, 1"},
	{at: 0, tenant: "alpha", weight: 3, f: 0.5, wait: time.Minute, taken: true, comment: "0.5 left"},
	{at: 0, tenant: "alpha", weight: 3, f: 0.5, wait: time.Minute, taken: true, comment: "0 left: takes, to -0.5"},
	{at: 0, tenant: "alpha", weight: 3, f: 0.25, wait: time.Minute, due: 30 * time.Second, comment: "-0.5 refills at 1 a minute"},
	{at: 0, tenant: "beta", weight: 1, f: 0.1, wait: time.Minute, taken: true, comment: "new: 1/4, full"},
	{at: time.Second, tenant: "alpha", weight: 3, f: 0.1, wait: time.Minute, due: 40 * time.Second, comment: "-0.4875 at 3/4 a minute"},
	{at: time.Second, tenant: "beta", weight: 1, f: 0.2, taken: true, comment: "0.15 + 1/240"},
	{at: time.Second, tenant: "beta", weight: 1, f: 0.1, due: 12 * time.Second, comment: "refused: after latest, active until now"},
	{at: 40 * time.Second, tenant: "alpha", weight: 3, f: 0.5, taken: true, comment: "beta dropped: alpha's share 1, -0.4875 + 39/60"},
	{at: 40 * time.Second, tenant: "beta", weight: 1, f: 0.25, taken: true, comment: "beta new again: full, to 0"},
	{at: 40 * time.Second, settle: 10, used: 0.05, comment: "0.2 back"},
	{at: 40 * time.Second, tenant: "beta", weight: 1, f: 0.2, taken: true, comment: "0.2, to 0"},
	{at: 40 * time.Second, tenant: "beta", weight: 1, f: 0.1, taken: true, comment: "0, to -0.1"},
	{at: 40 * time.Second, tenant: "beta", weight: 1, f: 0.1, wait: time.Minute, due: 64 * time.Second, comment: "-0.1 at 1/4 a minute"},
	{at: 40 * time.Second, tenant: "alpha", weight: 1, f: 0.1, wait: time.Minute, due: 80*time.Second + 500*time.Millisecond, comment: "weight 1: share 1/2, -0.3375"},
}

// sharesArithmetic runs shareSteps and checks each answer to the
// microsecond; with a shared store the steps alternate between two
// stores, each settling its own reservations.
func (e *env) sharesArithmetic(t *testing.T) {
	n := 1
	if e.o.Shared {
		n = 2
	}
	stores := e.stores(t, n)
	shs := make([]fleet.LimitShares, n)
	for i, s := range stores {
		shs[i] = newShares(t, s)
	}
	runShareSteps(t, shs, func(k int) { flush(t, stores[k]) })
}

// ShareSteps runs the shares' arithmetic of the suite (a table of asks
// and settlings, from [Base], with their exact answers) on s alone, so
// that a store's own tests can look at the state the steps leave: the
// tenants alpha and beta active, both of weight 1 at the end, the last
// activity 80.5 s after Base.
func ShareSteps(t *testing.T, s fleet.LimitShares) {
	t.Helper()
	runShareSteps(t, []fleet.LimitShares{s}, func(int) {})
}

// runShareSteps runs shareSteps in turn on shs, each settling its own
// reservations, and calls after with the index of the one that answered
// each step.
func runShareSteps(t *testing.T, shs []fleet.LimitShares, after func(k int)) {
	t.Helper()
	ctx := context.Background()
	rs := make([]fleet.ShareReservation, len(shareSteps))
	by := make([]int, len(shareSteps))
	for i, st := range shareSteps {
		now := Base.Add(st.at)
		if st.settle > 0 {
			k := by[st.settle-1]
			must(t, "Settle", shs[k].Settle(ctx, now, rs[st.settle-1], st.used))
			after(k)
			continue
		}
		k := i % len(shs)
		r, due, err := shs[k].Take(ctx, now, fleet.ShareAsk{Tenant: st.tenant, Weight: st.weight, Fraction: st.f}, now.Add(st.wait))
		must(t, "Take", err)
		after(k)
		rs[i], by[i] = r, k
		want := now
		if !st.taken {
			want = Base.Add(st.due)
		}
		if r.Taken() != st.taken || due.Sub(want).Abs() > time.Microsecond {
			t.Errorf("step %d on store %d (%s): taken %v, due %v; want %v, %v", i+1, k, st.comment, r.Taken(), due.Sub(Base), st.taken, want.Sub(Base))
		}
	}
}

// sharesBadAsks: an ask with a field that cannot be used is an error
// naming it, and takes nothing.
func (e *env) sharesBadAsks(t *testing.T) {
	s := e.new(t)
	sh := newShares(t, s)
	ctx := context.Background()
	for _, c := range []struct {
		ask          fleet.ShareAsk
		field, value string
	}{
		{fleet.ShareAsk{Tenant: "", Weight: 1, Fraction: 0.5}, "Tenant", `""`},
		{fleet.ShareAsk{Tenant: "a b", Weight: 1, Fraction: 0.5}, "Tenant", `"a b"`},
		{fleet.ShareAsk{Tenant: "alpha", Weight: 0, Fraction: 0.5}, "Weight", "0"},
		{fleet.ShareAsk{Tenant: "alpha", Weight: 1001, Fraction: 0.5}, "Weight", "1001"},
		{fleet.ShareAsk{Tenant: "alpha", Weight: 1, Fraction: 0}, "Fraction", "0"},
		{fleet.ShareAsk{Tenant: "alpha", Weight: 1, Fraction: 1.5}, "Fraction", "1.5"},
	} {
		r, _, err := sh.Take(ctx, Base, c.ask, Base)
		wantFieldError(t, "Take", err, c.field, c.value)
		if r != nil && r.Taken() {
			t.Errorf("Take(%+v) took", c.ask)
		}
	}
	// Nothing was taken: alpha, new, takes its whole share twice.
	for i := range 2 {
		r, _, err := sh.Take(ctx, Base, fleet.ShareAsk{Tenant: "alpha", Weight: 1, Fraction: 1}, Base)
		if err != nil || !r.Taken() {
			t.Fatalf("Take %d of alpha after the bad asks = taken %v, %v; want taken", i+1, r.Taken(), err)
		}
	}
}
