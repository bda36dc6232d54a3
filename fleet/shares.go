package fleet

import (
	"context"
	"math"
	"sync"
	"time"
)

// ShareStore is a [Store] that shares the tenants' shares of each limit
// group's rate limit.
type ShareStore interface {
	LimitShares(ShareSettings) (LimitShares, error)
}

// ShareSettings are one limit group's values for its tenants' shares.
type ShareSettings struct {
	// Group is the group's name, as in [LimitSettings].
	Group string
}

const (
	// TenantIdle is how long a tenant stays active after its last ask
	// (or the due time it was given, if it waits for it): an idle
	// tenant holds no share, and its weight no longer divides the limit.
	TenantIdle = 5 * time.Second
	// MaxShareTenants bounds the tenants one group's shares hold: a new
	// one beyond it drops the least recently active.
	MaxShareTenants = 1000
	// maxShareTenantName bounds a tenant's name, as a Proxy does.
	maxShareTenantName = 64
)

// ShareAsk is one request's ask of its tenant's share.
type ShareAsk struct {
	// Tenant names the tenant: 1 to 64 ASCII letters, digits, '-', '_'
	// or '.'.
	Tenant string
	// Weight is the tenant's weight, 1 to 1000.
	Weight int
	// Fraction is what the request costs, in minutes of the group's
	// limit: the largest, over the buckets whose limit is known, of its
	// cost over the limit; in (0, 1].
	Fraction float64
}

// LimitShares are the tenants' shares of one limit group's rate limit,
// in minutes of that limit: under contention each tenant active gets
// at least its weight over the summed weights of the tenants active.
//
// Each active tenant has a bucket of capacity s = its weight over the
// summed weights of the active tenants (the capacities sum to one minute
// of the limit, as the group's buckets hold one minute), refilling at s a
// minute. A request takes its fraction while its tenant's bucket holds at
// least 0, and may drive it below 0; otherwise it is due when the bucket
// has refilled to 0. A tenant is active from its first ask until
// [TenantIdle] after its last (or after the due time of an ask that will
// wait for it); a tenant new or active again starts full. With one tenant
// active its share is the whole limit, and the group's buckets decide.
type LimitShares interface {
	// Take asks at now for a's fraction, for a request that can be sent
	// no later than latest. It either takes (r.Taken()), due at now, or
	// takes nothing and the request may take no sooner than due: after
	// latest it is refused, else its caller waits until due and asks
	// again.
	Take(ctx context.Context, now time.Time, a ShareAsk, latest time.Time) (r ShareReservation, due time.Time, err error)
	// Settle replaces what r took by used, in minutes of the limit: 0
	// gives it all back (a request never sent). r is settled once; a
	// tenant dropped since gets nothing back.
	Settle(ctx context.Context, now time.Time, r ShareReservation, used float64) error
}

// ShareReservation is what one request took from its tenant's share.
type ShareReservation interface {
	// Taken reports whether it took and is not settled yet.
	Taken() bool
}

// CheckShareAsk returns an error naming the first field of a that cannot
// be used.
func CheckShareAsk(a ShareAsk) error {
	if !shareName(a.Tenant) {
		return fieldError("ShareAsk.Tenant", quoteName(a.Tenant), "want 1 to 64 ASCII letters, digits, '-', '_' or '.'")
	}
	if a.Weight < 1 || a.Weight > 1000 {
		return fieldError("ShareAsk.Weight", a.Weight, "must be in [1, 1000]")
	}
	if math.IsNaN(a.Fraction) || a.Fraction <= 0 || a.Fraction > 1 {
		return fieldError("ShareAsk.Fraction", a.Fraction, "must be in (0, 1]")
	}
	return nil
}

func shareName(s string) bool {
	if s == "" || len(s) > maxShareTenantName {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// quoteName quotes at most the start of a name, for an error.
func quoteName(s string) string {
	if len(s) > maxShareTenantName {
		s = s[:maxShareTenantName] + "..."
	}
	return `"` + s + `"`
}

// ShareSlack is how far below 0 a tenant's bucket may be and still take,
// relative to its share: rounding in a due time never makes a request
// wait twice.
const ShareSlack = 1e-9

// LimitShares returns a group's shares in memory, for the tenants of one
// process.
func (MemoryStore) LimitShares(s ShareSettings) (LimitShares, error) {
	if s.Group == "" {
		return nil, fieldError("ShareSettings.Group", `""`, "a limit group needs a name")
	}
	return &memoryShares{tenants: map[string]*tenantShare{}}, nil
}

var _ ShareStore = MemoryStore{}

// memoryShares are [LimitShares] in memory.
type memoryShares struct {
	mu      sync.Mutex
	tenants map[string]*tenantShare
	weights int       // Σ weight over tenants
	sweepAt time.Time // no tenant is idle before this
}

// tenantShare is one active tenant's bucket.
type tenantShare struct {
	weight int
	level  float64   // minutes of the limit; may be below 0
	at     time.Time // when level held
	active time.Time // its last ask, or the due time it waits for
}

// shareTaken is one request's take.
type shareTaken struct {
	tenant string
	f      float64
	taken  bool
}

func (r *shareTaken) Taken() bool { return r != nil && r.taken }

func (*memoryShares) inMemory() {}

// sweep drops the tenants idle at now; it requires m.mu.
func (m *memoryShares) sweep(now time.Time) {
	if now.Before(m.sweepAt) {
		return
	}
	var next time.Time
	for name, t := range m.tenants {
		end := t.active.Add(TenantIdle)
		if now.After(end) {
			m.weights -= t.weight
			delete(m.tenants, name)
			continue
		}
		if next.IsZero() || end.Before(next) {
			next = end
		}
	}
	m.sweepAt = next
}

// share is t's capacity; it requires m.mu.
func (m *memoryShares) share(t *tenantShare) float64 {
	return float64(t.weight) / float64(m.weights)
}

// advance refills t up to now at its share s, and keeps it within s.
func (t *tenantShare) advance(now time.Time, s float64) {
	if now.After(t.at) {
		t.level += s * now.Sub(t.at).Seconds() / 60
		t.at = now
	}
	t.level = min(t.level, s)
}

// Take implements [LimitShares].
func (m *memoryShares) Take(_ context.Context, now time.Time, a ShareAsk, latest time.Time) (ShareReservation, time.Time, error) {
	if err := CheckShareAsk(a); err != nil {
		return &shareTaken{}, now, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sweep(now)
	t := m.tenants[a.Tenant]
	if t == nil {
		if len(m.tenants) >= MaxShareTenants {
			m.dropOldest()
		}
		t = &tenantShare{weight: a.Weight, at: now, active: now}
		m.tenants[a.Tenant] = t
		m.weights += a.Weight
		t.level = m.share(t)
	} else if t.weight != a.Weight {
		m.weights += a.Weight - t.weight
		t.weight = a.Weight
	}
	s := m.share(t)
	t.advance(now, s)
	if t.level >= -s*ShareSlack {
		t.level -= a.Fraction
		t.active = later(t.active, now)
		return &shareTaken{tenant: a.Tenant, f: a.Fraction, taken: true}, now, nil
	}
	due := now.Add(minutes(-t.level / s))
	if due.After(latest) {
		t.active = later(t.active, now)
	} else {
		t.active = later(t.active, due)
	}
	return &shareTaken{}, due, nil
}

// dropOldest drops the least recently active tenant; it requires m.mu.
func (m *memoryShares) dropOldest() {
	var oldest string
	var at time.Time
	for name, t := range m.tenants {
		if oldest == "" || t.active.Before(at) {
			oldest, at = name, t.active
		}
	}
	m.weights -= m.tenants[oldest].weight
	delete(m.tenants, oldest)
}

// Settle implements [LimitShares].
func (m *memoryShares) Settle(_ context.Context, now time.Time, rr ShareReservation, used float64) error {
	r, ok := rr.(*shareTaken)
	if !ok || !r.taken {
		return nil
	}
	r.taken = false
	if math.IsNaN(used) || used < 0 {
		used = 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.tenants[r.tenant]
	if t == nil {
		return nil
	}
	s := m.share(t)
	t.advance(now, s)
	t.level = min(t.level+r.f-used, s)
	return nil
}

// minutes is x minutes as a duration, rounded up to the nanosecond.
func minutes(x float64) time.Duration {
	return time.Duration(math.Ceil(x * 60e9))
}
