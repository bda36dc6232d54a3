package fleet

import (
	"context"
	"sync/atomic"
)

// ThrottleStore is a [Store] that shares the retry throttle's count.
type ThrottleStore interface {
	Throttle(ThrottleSettings) (Throttle, error)
}

// ThrottleSettings are the retry throttle's values. Damper keeps the
// throttle's rule: each answered attempt adds TokenRatio, each failed
// attempt that could be retried takes one token, and no retry is made
// while half of MaxTokens or fewer are left.
type ThrottleSettings struct {
	// MaxTokens is the number of tokens, and where the count starts: 1 to
	// 1000.
	MaxTokens int
	// TokenRatio is what each answered attempt earns, in (0, 1]: Damper
	// adds it; a store need not read it.
	TokenRatio float64
}

// Throttle holds the retry throttle's count of tokens, in thousandths of a
// token, within [0, MaxTokens×1000], starting full. Damper keeps the
// throttle's rule (see [ThrottleSettings]).
type Throttle interface {
	// Add adds delta thousandths of a token (a negative delta takes),
	// keeping the count within its bounds.
	Add(ctx context.Context, delta int64) error
	// Tokens returns the count, in thousandths of a token.
	Tokens(ctx context.Context) (int64, error)
}

// Throttle returns a count of MaxTokens, full, in one atomic integer.
func (MemoryStore) Throttle(s ThrottleSettings) (Throttle, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	t := &memoryThrottle{max: int64(s.MaxTokens) * 1000}
	t.tokens.Store(t.max)
	return t, nil
}

// check returns an error naming a field that cannot be used.
func (s ThrottleSettings) check() error {
	if s.MaxTokens < 1 || s.MaxTokens > 1000 {
		return fieldError("ThrottleSettings.MaxTokens", s.MaxTokens, "must be in [1, 1000]")
	}
	return nil
}

// memoryThrottle is a throttle's count in one atomic integer.
type memoryThrottle struct {
	max    int64
	tokens atomic.Int64
}

func (t *memoryThrottle) Add(_ context.Context, delta int64) error {
	for {
		old := t.tokens.Load()
		n := min(max(old+delta, 0), t.max)
		if n == old || t.tokens.CompareAndSwap(old, n) {
			return nil
		}
	}
}

func (t *memoryThrottle) Tokens(context.Context) (int64, error) { return t.tokens.Load(), nil }

func (*memoryThrottle) inMemory() {}

var _ ThrottleStore = MemoryStore{}
