package engine

import (
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/damper-ai/damper-go/fleet"
)

// The race of a hedged round: the attempt the loop sent and its hedge.

// errHedgeLost ends an attempt whose race another attempt won.
var errHedgeLost = errors.New("damper: another attempt of the call answered first")

// race is one round of a hedged call: the attempt the loop sent and, after
// delay, its hedge. The first to answer claims the win (a plain answer
// once read whole, a stream at its first content); the other can no longer
// win and hands nothing to the caller.
type race struct {
	c       *call
	won     atomic.Bool
	delay   time.Duration // after which the hedge is due
	results chan raced
	flying  []*attempt // sent, and their results not yet in
}

// raced is an attempt of a race and what it came to.
type raced struct {
	a *attempt
	r attemptResult
}

// newRace is a round of c whose hedge is due after delay.
func newRace(c *call, delay time.Duration) *race {
	return &race{c: c, delay: delay, results: make(chan raced, 2)}
}

// claim claims the win, and reports whether it was still to be had.
func (rc *race) claim() bool { return rc.won.CompareAndSwap(false, true) }

// run sends attempt a, started, and after the delay, if no attempt has
// answered, its hedge, and returns the attempt whose result ends the race:
// the first answer, or a failure that is not retried (every attempt still
// in flight is then cancelled), or the last of the failures. Every failure
// is judged (ended, and told to the passes and observers) as it comes, so
// a failed attempt with the hedge in flight waits for the hedge instead of
// retrying on top of it. When run returns, every attempt it sent has ended
// but the winner, which ends as a plain call's does (it is ended here) or
// with its stream, and no goroutine of it is left.
func (rc *race) run(a *attempt) (*attempt, attemptResult, Classification, bool) {
	c := rc.c
	c.out.own()
	rc.send(a)
	due := make(chan struct{}, 1)
	stop := c.d.clock.AfterFunc(rc.delay, func() { due <- struct{}{} })
	defer stop()
	for {
		select {
		case <-due:
			if len(rc.results) > 0 {
				continue // an answer came with the delay: it goes first, and no hedge leaves
			}
			if h := admitHedge(c); h != nil {
				rc.send(h)
			}
		case x := <-rc.results:
			rc.flying = slices.DeleteFunc(rc.flying, func(f *attempt) bool { return f == x.a })
			c.d.hedge.noteLatency(c.latencyKey, x.a.start, x.r.firstAt)
			if x.r.failure == nil {
				stop()
				rc.end()
				if !c.stream {
					x.a.end(succeeded(x.r.res))
				}
				if x.a.hedge {
					c.report.hedgeWon()
					c.trace.hedgeResult(hedgeWon)
				}
				return x.a, x.r, Classification{}, false
			}
			if x.r.err == errHedgeLost {
				rc.lose(x.a, x.r) // the winner's result comes next
				continue
			}
			cls, canceled := c.judge(x.a, x.r)
			if len(rc.flying) > 0 && !canceled && cls.Class == Retryable {
				continue
			}
			stop()
			rc.end()
			return x.a, x.r, cls, canceled
		}
	}
}

// send sends attempt a in the race, on a goroutine of its own.
func (rc *race) send(a *attempt) {
	a.race = rc
	rc.flying = append(rc.flying, a)
	go func() { rc.results <- raced{a, a.send()} }()
}

// end cancels the attempts still in flight and ends each as its result
// comes: lost, or canceled when the caller's context ended.
func (rc *race) end() {
	c := rc.c
	rc.claim() // none of them can win now
	for _, a := range rc.flying {
		a.cancel(errHedgeLost)
	}
	for range rc.flying {
		x := <-rc.results
		if c.ctx.Err() != nil && x.r.failure != nil {
			c.judge(x.a, x.r)
			continue
		}
		CloseBody(x.r.res)
		rc.lose(x.a, x.r)
	}
}

// lose ends attempt a, which lost the race, with its result r. Its time
// so far is a lower bound of its latency, kept for the hedge delay when it
// is at least the delay: without it, the slow attempts that hedges cancel
// would leave the statistics, and the quantile would fall.
func (rc *race) lose(a *attempt, r attemptResult) {
	c := rc.c
	if h := c.d.hedge; h != nil && r.firstAt.IsZero() {
		if took := c.d.clock.Now().Sub(a.start); took >= rc.delay {
			h.record(c.latencyKey, took)
		}
	}
	a.end(AttemptReport{Class: NotRetryable, Kind: "hedge_lost", Err: errHedgeLost.Error(), Lost: true})
	a.tell(attemptEvent{Outcome: fleet.AttemptOutcome{First: a.first}, Class: NotRetryable, Failure: &Failure{Err: errHedgeLost}})
}
