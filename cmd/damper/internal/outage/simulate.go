package outage

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/damper-ai/damper-go"
	"github.com/damper-ai/damper-go/dampertest"
)

// epoch is where every virtual clock starts. Its UnixNano is 0, so the
// retry budget's fixed windows begin exactly when the run does, whatever
// the window length.
var epoch = time.Unix(0, 0).UTC()

// Simulate runs the outage of cfg three times, with the naive loop, with
// Damper, and with Damper under [Protected] policy, each against its own
// fake API and virtual clock.
func Simulate(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	probe, err := damper.New(cfg.Policy)
	if err != nil {
		return Result{}, err
	}
	protected, err := damper.New(Protected(cfg.Policy))
	if err != nil {
		return Result{}, err
	}
	res := Result{
		Requests: cfg.Requests, Failures: cfg.Failures, Concurrency: cfg.Concurrency,
		Seed: cfg.Seed, Policy: probe.Policy(), Protected: protected.Policy(),
	}
	if res.Naive, err = SimulateNaive(ctx, cfg); err != nil {
		return Result{}, err
	}
	if res.Damper, err = SimulateDamper(ctx, cfg); err != nil {
		return Result{}, err
	}
	if res.Breaker, err = SimulateBreaker(ctx, cfg); err != nil {
		return Result{}, err
	}
	return res, nil
}

// SimulateNaive runs the outage with a plain loop around the SDK: the SDK's
// own retries off, up to Policy.MaxAttempts attempts per logical request,
// full-jitter backoff between them on the virtual clock, no budget.
func SimulateNaive(ctx context.Context, cfg Config) (Run, error) {
	if err := cfg.Validate(); err != nil {
		return Run{}, err
	}
	d, _ := damper.New(cfg.Policy) // for the policy's defaults only
	p := d.Policy()
	clock := dampertest.NewClock(epoch)
	fake := newAPI(cfg.Failures, clock)
	client := newClient(fake)
	rnd := newRand(cfg.Seed)

	var mu sync.Mutex
	outcomes := map[damper.Outcome]int{}
	err := forEach(ctx, cfg, func(i int) error {
		outcome := damper.OutcomeAttemptsExhausted
		for n := 1; n <= p.MaxAttempts; n++ {
			_, err := client.Messages.New(ctx, params(i), option.WithMaxRetries(0), tag(i))
			if err == nil {
				outcome = damper.OutcomeSuccess
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if n < p.MaxAttempts {
				_ = clock.Sleep(ctx, fullJitter(n, p.BackoffBase, p.BackoffMax, rnd()))
			}
		}
		mu.Lock()
		outcomes[outcome]++
		mu.Unlock()
		return nil
	})
	if err != nil {
		return Run{}, err
	}
	return collect("naive", cfg, fake, clock, outcomes), nil
}

// SimulateDamper runs the outage with the SDK client wrapped by a Damper of
// cfg.Policy on the virtual clock. Each logical request is one SDK call;
// Damper owns its retries, and its report says how the call ended.
func SimulateDamper(ctx context.Context, cfg Config) (Run, error) {
	return simulateDamper(ctx, cfg, "damper", cfg.Policy)
}

// SimulateBreaker runs the outage like SimulateDamper, under the policy
// [Protected] makes of cfg.Policy. Requests come one after another and
// the virtual clock moves only while a request waits for its retry, so
// once the breaker opens no time passes and it stays open: every later
// request fails at once, with nothing sent.
func SimulateBreaker(ctx context.Context, cfg Config) (Run, error) {
	return simulateDamper(ctx, cfg, "damper+breaker", Protected(cfg.Policy))
}

func simulateDamper(ctx context.Context, cfg Config, name string, p damper.Policy) (Run, error) {
	if err := cfg.Validate(); err != nil {
		return Run{}, err
	}
	clock := dampertest.NewClock(epoch)
	d, err := damper.New(p, damper.WithClock(clock), damper.WithRand(newRand(cfg.Seed)))
	if err != nil {
		return Run{}, err
	}
	fake := newAPI(cfg.Failures, clock)
	client := newClient(fake, d.Option())

	var mu sync.Mutex
	outcomes := map[damper.Outcome]int{}
	err = forEach(ctx, cfg, func(i int) error {
		var rep damper.Report
		_, err := client.Messages.New(damper.ContextWithReport(ctx, &rep), params(i), tag(i))
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if rep.Outcome == "" {
			// Damper did not see the call: the run would be meaningless.
			return errors.Join(errors.New("outage: a call went out without a Damper report"), err)
		}
		mu.Lock()
		outcomes[rep.Outcome]++
		mu.Unlock()
		return nil
	})
	if err != nil {
		return Run{}, err
	}
	return collect(name, cfg, fake, clock, outcomes), nil
}

// forEach calls f for request indexes 0..cfg.Requests-1 on cfg.Concurrency
// goroutines, in order when there is one, and returns the first error.
func forEach(ctx context.Context, cfg Config, f func(i int) error) error {
	if cfg.Concurrency == 1 {
		for i := range cfg.Requests {
			if err := f(i); err != nil {
				return err
			}
		}
		return nil
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range cfg.Concurrency {
		wg.Go(func() {
			for i := range next {
				if err := f(i); err != nil {
					cancel(err)
				}
			}
		})
	}
	for i := range cfg.Requests {
		select {
		case next <- i:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}

func collect(name string, cfg Config, fake *api, clock *dampertest.Clock, outcomes map[damper.Outcome]int) Run {
	n, times := fake.attempts()
	r := Run{
		Name: name, Requests: cfg.Requests, Attempts: n, Outcomes: outcomes,
		Elapsed: clock.Now().Sub(epoch), AttemptTimes: times,
	}
	r.finish()
	return r
}

// newClient returns an SDK client that sends every request to fake, in
// memory, with the given options first (Damper's, for the Damper run).
func newClient(fake http.Handler, opts ...option.RequestOption) anthropic.Client {
	return anthropic.NewClient(append(opts,
		option.WithBaseURL("http://fake-anthropic.invalid"),
		option.WithAPIKey("outage-demo"),
		option.WithHTTPClient(&http.Client{Transport: dampertest.Transport(fake)}),
	)...)
}

func params(i int) anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model:     anthropic.Model("claude-sonnet-5-5"),
		MaxTokens: 256,
		Messages: []anthropic.MessageParam{
			anthropic.NewUserMessage(anthropic.NewTextBlock("Summarize ticket " + strconv.Itoa(i))),
		},
	}
}

func tag(i int) option.RequestOption {
	return option.WithHeader(requestHeader, strconv.Itoa(i))
}

// fullJitter is the naive loop's wait before retry n: uniform in
// [0, min(max, base·2^(n-1))], the same rule as Damper's backoff.
func fullJitter(n int, base, maxWait time.Duration, rnd float64) time.Duration {
	ceiling := maxWait
	if shift := n - 1; shift < 62 && base <= maxWait>>shift {
		ceiling = base << shift
	}
	return time.Duration(rnd * float64(ceiling))
}

// newRand returns a seeded source of numbers in [0, 1), safe for concurrent
// use as damper.WithRand requires.
func newRand(seed uint64) func() float64 {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Float64()
	}
}
