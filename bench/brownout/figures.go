package brownout

import (
	"slices"
	"time"
)

// Figures are the numbers of one contender in one scenario, over the
// logical requests issued while the incident lasted.
type Figures struct {
	Requests int
	// Amplification is provider attempts per logical request.
	Amplification float64
	// Goodput is successful logical requests per second of incident.
	Goodput float64
	// SuccessShare is the share of the requests that succeeded.
	SuccessShare float64
	// P50 and P99 are the logical latency, successes and failures alike.
	P50, P99 time.Duration
	// FailedFast is the share that failed before its deadline; TimedOut
	// the share ended by its deadline.
	FailedFast, TimedOut float64
	// Recovery is the time from the end of the incident until the
	// requests issued succeed at RecoveryShare or better in every second
	// for the rest of the run; Recovered is false if that never happens.
	Recovery  time.Duration
	Recovered bool
}

// RecoveryShare is the share of requests that must succeed for a second
// of the run to count as recovered: 95 % goodput.
const RecoveryShare = 0.95

// Figures computes the figures of r.
func (r *Result) Figures() Figures {
	inc := r.Scenario.Provider.Incident
	from, to := inc.Start, inc.Start+inc.Length
	var f Figures
	var attempts, ok, fast, timedOut int
	var lat []time.Duration
	for _, q := range r.Requests {
		if q.Issued < from || q.Issued >= to {
			continue
		}
		f.Requests++
		attempts += q.Attempts
		lat = append(lat, q.Ended-q.Issued)
		switch {
		case q.OK:
			ok++
		case q.TimedOut:
			timedOut++
		default:
			fast++
		}
	}
	if f.Requests > 0 {
		n := float64(f.Requests)
		f.Amplification = float64(attempts) / n
		f.SuccessShare = float64(ok) / n
		f.FailedFast = float64(fast) / n
		f.TimedOut = float64(timedOut) / n
		f.Goodput = float64(ok) / inc.Length.Seconds()
		slices.Sort(lat)
		f.P50 = quantile(lat, 0.50)
		f.P99 = quantile(lat, 0.99)
	}
	f.Recovery, f.Recovered = r.recovery(to)
	return f
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted)) + 0.5)
	return sorted[min(max(i-1, 0), len(sorted)-1)]
}

// recovery finds the first whole second at or after end from which every
// second, to the end of arrivals, has its issued requests succeed at
// RecoveryShare or better.
func (r *Result) recovery(end time.Duration) (time.Duration, bool) {
	seconds := int(r.Scenario.Duration / time.Second)
	issued := make([]int, seconds)
	okd := make([]int, seconds)
	for _, q := range r.Requests {
		sec := int(q.Issued / time.Second)
		if sec >= seconds {
			continue
		}
		issued[sec]++
		if q.OK {
			okd[sec]++
		}
	}
	first := int((end + time.Second - 1) / time.Second)
	recovered := seconds
	for sec := seconds - 1; sec >= first; sec-- {
		if issued[sec] > 0 && float64(okd[sec]) < RecoveryShare*float64(issued[sec]) {
			break
		}
		recovered = sec
	}
	if recovered >= seconds {
		return 0, false
	}
	return time.Duration(recovered)*time.Second - end, true
}
