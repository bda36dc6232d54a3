package fleet

import (
	"context"
	"math"
	"strconv"
	"sync/atomic"
	"time"
)

// SpendStore is a [Store] that shares a tenant's spend of the day, which
// its daily cost ceiling is checked against.
type SpendStore interface {
	Spend(SpendSettings) (Spend, error)
}

// SpendSettings name the tenant whose spend it is.
type SpendSettings struct {
	// Tenant is the tenant's name: 1 to 64 ASCII letters, digits, '-',
	// '_' or '.'. A store keeps each tenant's count apart.
	Tenant string
}

// MaxSpendAdd bounds the dollars of one [Spend.Add]: the largest daily
// cost ceiling a tenant may have. A call priced above it is counted as
// it, which is over every ceiling.
const MaxSpendAdd = 1e6

// Spend counts a tenant's spend, in US dollars, by UTC day: the day
// holding the now given, which begins at 00:00 UTC with nothing spent.
// The count is kept in whole nanodollars (1e-9 USD), so that a sum of
// many calls does not drift: Add rounds to the nearest.
// Implementations must be safe for concurrent use and cheap: Damper asks
// Spent before each request of a tenant with a ceiling, and Adds each of
// its calls' cost as the call ends.
//
// A spend backed by a remote store may fail or time out: its methods
// then still answer (from what this process knows) and return the error
// as well, which Damper logs.
type Spend interface {
	// Spent returns the dollars spent in the UTC day holding now.
	Spent(ctx context.Context, now time.Time) (usd float64, err error)
	// Add counts usd dollars spent in the UTC day holding now. It refuses
	// a usd that is not a finite number in [0, MaxSpendAdd], naming it.
	Add(ctx context.Context, now time.Time, usd float64) error
}

// Spend returns a count of the day in memory, one atomic integer.
func (MemoryStore) Spend(s SpendSettings) (Spend, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return &memorySpend{}, nil
}

// check returns an error naming a field that cannot be used.
func (s SpendSettings) check() error {
	if !tenantName(s.Tenant) {
		name := s.Tenant
		if len(name) > 64 {
			name = name[:64] + "..."
		}
		return fieldError("SpendSettings.Tenant", strconv.Quote(name), "want 1 to 64 ASCII letters, digits, '-', '_' or '.'")
	}
	return nil
}

// tenantName reports whether name is a tenant's name.
func tenantName(name string) bool {
	ok := name != "" && len(name) <= 64
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.'
	}
	return ok
}

// utcDay numbers the UTC day holding now, in days since the Unix epoch.
func utcDay(now time.Time) int64 {
	s := now.Unix()
	d := s / 86400
	if s%86400 < 0 {
		d--
	}
	return d
}

// SpendNanos is usd in whole nanodollars, rounded to the nearest, or an
// error naming usd when it is not a finite number in [0, MaxSpendAdd].
func SpendNanos(usd float64) (int64, error) {
	if math.IsNaN(usd) || usd < 0 || usd > MaxSpendAdd {
		return 0, fieldError("Spend.Add usd", usd, "must be a finite number of dollars in [0, 1e6]")
	}
	return int64(math.Round(usd * 1e9)), nil
}

// memorySpend is a tenant's count of the day in memory. A late Add,
// whose now is in a day before the current one, counts in the current
// one, as a late caller of [WindowBudget] does.
type memorySpend struct {
	cur atomic.Pointer[dayCount]
}

type dayCount struct {
	day   int64
	nanos atomic.Int64
}

// dayAt returns the count of the day holding now, starting a new one when
// now has moved past the current one.
func (m *memorySpend) dayAt(now time.Time) *dayCount {
	id := utcDay(now)
	for {
		d := m.cur.Load()
		if d != nil && d.day >= id {
			return d
		}
		next := &dayCount{day: id}
		if m.cur.CompareAndSwap(d, next) {
			return next
		}
	}
}

func (m *memorySpend) Spent(_ context.Context, now time.Time) (float64, error) {
	return float64(m.dayAt(now).nanos.Load()) / 1e9, nil
}

func (m *memorySpend) Add(_ context.Context, now time.Time, usd float64) error {
	n, err := SpendNanos(usd)
	if err != nil {
		return err
	}
	if n > 0 {
		m.dayAt(now).nanos.Add(n)
	}
	return nil
}

func (*memorySpend) inMemory() {}

var _ SpendStore = MemoryStore{}
