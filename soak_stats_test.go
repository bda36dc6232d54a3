package damper_test

import (
	"fmt"
	"sort"
	"strings"

	"github.com/damper-ai/damper-go"
)

// soakStats are the figures of a run, logged and recorded in
// docs/RELIABILITY.md.
type soakStats struct {
	requests, streams, cancels int
	sdkLimits                  int // calls given option.WithRequestTimeout
	attempts, served           int64
	lost                       int // attempts cut by the caller before the server saw them
	outcomes                   map[damper.Outcome]int
	faults                     [nFaultKinds]int64
	retries                    int
	windows, bindingWindows    int
	stopped                    int    // calls the caller's deadline or cancellation ended, at that instant
	ends                       [3]int // by callEnd: agreed, streams dropped by the SDK, plain calls failed by the SDK after their end
}

// count adds one call's plan and result to the totals both soaks keep.
func (st *soakStats) count(p reqPlan, r soakResult) {
	st.attempts += int64(r.report.Attempts)
	st.outcomes[r.report.Outcome]++
	if p.stream {
		st.streams++
	}
	if p.cancelAt > 0 {
		st.cancels++
	}
	if p.sdkLimit > 0 {
		st.sdkLimits++
	}
}

func (st *soakStats) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d logical requests (%d streams, %d cancelled by the caller, %d with an SDK request timeout), %d attempts sent, %d received, %d cut before the server\n",
		st.requests, st.streams, st.cancels, st.sdkLimits, st.attempts, st.served, st.lost)
	fmt.Fprintf(&b, "retries authorized %d; budget windows %d, %d of them filled to the rule's limit; %d calls ended by their deadline or cancellation\n",
		st.retries, st.windows, st.bindingWindows, st.stopped)
	fmt.Fprintf(&b, "reports that are the caller's result %d; streams the SDK dropped as its context ended %d; plain calls the SDK failed as their context ended after Damper's success %d\n",
		st.ends[endAgreed], st.ends[endDropped], st.ends[endSDKGap])
	outcomes := make([]string, 0, len(st.outcomes))
	for o, n := range st.outcomes {
		name := string(o)
		if o == "" {
			name = "none (streams the SDK dropped)"
		}
		outcomes = append(outcomes, fmt.Sprintf("%s %d", name, n))
	}
	sort.Strings(outcomes)
	fmt.Fprintf(&b, "outcomes: %s\nattempts served by fault:", strings.Join(outcomes, ", "))
	for k, n := range st.faults {
		fmt.Fprintf(&b, " %s %d;", faultNames[k], n)
	}
	return b.String()
}
