package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"time"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/redisstore"
	"github.com/redis/go-redis/v9"
)

// Every process of the fleet builds its Damper the same way: the budget's
// Name, Ratio, Window and MinTokens are what make them share one budget.
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer rdb.Close()
	budget, err := redisstore.NewBudget(rdb, redisstore.Options{
		Name:      "checkout",
		Ratio:     0.1,
		Window:    time.Minute,
		MinTokens: 10,
	})
	if err != nil {
		log.Fatal(err)
	}
	d, err := damper.New(damper.RecommendedPolicy(),
		damper.WithName("checkout"), damper.WithBudget(budget))
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
	budget, err := redisstore.NewBudget(rdb, redisstore.Options{Name: "checkout", MinTokens: 1, Ratio: damper.None})
	if err != nil {
		log.Fatal(err)
	}
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
