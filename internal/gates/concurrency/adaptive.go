package concurrency

import (
	"errors"
	"math"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/internal/core"
)

// The adaptive concurrency limit: each answered attempt of a cohort feeds
// it its time at the provider, from which it grows or shrinks.

// concWindowSamples is what a cohort's ends hold.
type concWindowSamples struct {
	ended     int     // attempts of the cohort that have ended
	logExcess float64 // the sum of ln(time / what its kind allows) of its answers
	ratioN    int
	overloads int
	logSum    [2]float64 // by kind, the sum of ln(seconds) of its answers
	kindN     [2]int
}

// latencyBest is what attempts of one kind take at their best, in ln
// seconds: a low level of their cohorts' typical times (geometric means,
// which one slow answer moves little). A cohort below it pulls it down by
// half the gap; one above, up by a twentieth of the gap, and only when no
// attempt of the cohort found the limit full (a provider kept busy by the
// limit shows what the limit allows, not what it can do). So it sits in
// the low quarter of the cohorts' times, not at the luckiest one, which
// would ever drift lower as cohorts add up.
type latencyBest struct {
	log   float64
	known bool
}

func (b *latencyBest) note(logMean float64, short bool) {
	switch {
	case !b.known:
		b.log, b.known = logMean, true
	case logMean < b.log:
		b.log += (logMean - b.log) / 2
	case !short:
		b.log += (logMean - b.log) / 20
	}
}

// sample takes the end of an attempt of the cohort: the time of an
// answer, or an overload (a 529, an attempt timeout); any other end (a
// failure that says nothing of the provider's load, a cancellation, a
// lost hedge) only counts as an end. Once the whole cohort has ended, the
// limit moves. The caller holds l.mu.
func (l *Limit) sample(took time.Duration, kind int, e core.Event) {
	w := &l.win
	switch {
	case e.Failure == nil && e.Outcome.Success:
		x := math.Log(max(took, time.Microsecond).Seconds())
		if b := l.kinds[kind]; b.known {
			w.logExcess += x - b.log - l.logAllowance(b.log)
			w.ratioN++
		}
		w.logSum[kind] += x
		w.kindN[kind]++
	case e.Failure != nil && (e.Failure.StatusCode == 529 || errors.Is(e.Failure.Err, core.ErrAttemptTimeout)):
		w.overloads++
	}
	if w.ended++; w.ended >= concWindow {
		l.adjust()
	}
}

// logAllowance is ln(allowed / best) for a kind whose best is
// exp(bestLog) seconds: Tolerance, or 1 + Slack / best when more.
func (l *Limit) logAllowance(bestLog float64) float64 {
	return math.Log(max(l.p.Tolerance, 1+l.p.Slack.Seconds()/math.Exp(bestLog)))
}

// adjust moves the limit once its cohort has ended, and starts the next
// cohort: at once, or, when the limit grew, once attempts fill it or the
// demand levels out below it (take). The limit grows only if an
// attempt found it full: one above the demand stays where it is. The
// caller holds l.mu.
func (l *Limit) adjust() {
	w := l.win
	next := l.limit
	switch {
	case w.overloads > 0:
		next *= concOverloadCut
	case w.ratioN > 0:
		g := math.Exp(-w.logExcess / float64(w.ratioN)) // what is allowed / the typical time
		switch {
		case g > 1 && !l.short:
			g = 1 // attempts did not need more room
		case g < 1 && l.limit <= float64(l.p.Min):
			// Slow at the least limit: the provider is slower for good,
			// not for this process's load. Its best is relearned.
			l.kinds = [2]latencyBest{}
		}
		next *= min(max(g, concCut), concGrowth)
	}
	for k := range l.kinds {
		if w.kindN[k] >= concKindSamples {
			l.kinds[k].note(w.logSum[k]/float64(w.kindN[k]), l.short)
		}
	}
	next = min(max(next, float64(l.p.Min)), float64(l.p.Max))
	grew := next > l.limit
	l.limit = next
	// Attempts sent while a higher limit fills up find the provider
	// emptier than it will be: the next cohort waits for it to fill, or
	// for the demand to show itself below it (take).
	l.peak, l.unfilled = l.held[fleet.Interactive]+l.held[fleet.Batch], 0
	if l.filling = grew && l.held[fleet.Interactive]+l.held[fleet.Batch] < l.slots(); !l.filling {
		l.newCohort()
	}
	l.grant()
}

// newCohort starts a cohort: the attempts sent from now on are sampled.
// The caller holds l.mu.
func (l *Limit) newCohort() {
	l.epoch++
	l.cohort, l.win, l.filling = 0, concWindowSamples{}, false
	l.below = l.held[fleet.Interactive]+l.held[fleet.Batch] < l.slots()
	l.short = l.line[fleet.Interactive].n+l.line[fleet.Batch].n > 0
}
