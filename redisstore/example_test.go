package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"time"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/redisstore"
	"github.com/redis/go-redis/v9"
)

// Every process of the fleet builds its Damper the same way: the store's
// Name makes them share one state, and the Policy gives its values (the
// budget's RetryBudgetRatio, RetryBudgetWindow and RetryBudgetMinTokens
// among them).
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rdb.Close()
	store, err := redisstore.New(rdb, redisstore.Options{Name: "checkout"})
	if err != nil {
		log.Fatal(err)
	}
	p := damper.RecommendedPolicy()
	p.RetryBudgetRatio, p.RetryBudgetWindow, p.RetryBudgetMinTokens = 0.1, time.Minute, 10
	d, err := damper.New(p, damper.WithName("checkout"), damper.WithStore(store))
	if err != nil {
		log.Fatal(err)
	}
	_ = d // anthropic.NewClient(d.Option()), as without Redis
}

// With Redis unreachable, the local budget decides, and the error says so.
func ExampleBudget_State() {
	rdb := redis.NewClient(&redis.Options{
		Dialer: func(context.Context, string, string) (net.Conn, error) {
			return nil, errors.New("no Redis here")
		},
	})
	defer rdb.Close()
	store, err := redisstore.New(rdb, redisstore.Options{Name: "checkout"})
	if err != nil {
		log.Fatal(err)
	}
	b, err := store.Budget(fleet.BudgetSettings{Ratio: 0, Window: time.Minute, MinTokens: 1})
	if err != nil {
		log.Fatal(err)
	}
	budget := b.(*redisstore.Budget)
	ctx, now := context.Background(), time.Now()
	for range 2 {
		granted, err := budget.Acquire(ctx, now)
		fmt.Printf("granted %v, state %v, error %v\n", granted, budget.State(), err != nil)
	}
	fmt.Println("switches to the fallback:", budget.Stats().Fallbacks)
	// Output:
	// granted true, state fallback, error true
	// granted false, state fallback, error true
	// switches to the fallback: 1
}
