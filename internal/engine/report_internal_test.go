package engine

import (
	"runtime"
	"testing"
	"time"
)

// A ReportInto destination's entry in the table of destinations goes with
// the destination, so that an option whose call never reached Damper
// leaves nothing behind.
func TestReportTableForgets(t *testing.T) {
	tokens := make([]string, 100)
	for i := range tokens {
		tokens[i] = reports.add(new(Report))
	}
	held := func() int {
		n := 0
		for _, tok := range tokens {
			if _, ok := reports.entries.Load(tok); ok {
				n++
			}
		}
		return n
	}
	kept := new(Report)
	keptToken := reports.add(kept)
	for i := 0; i < 100 && held() > 0; i++ {
		runtime.GC()
		runtime.Gosched()
	}
	if n := held(); n > 0 {
		t.Fatalf("%d of 100 entries left after their destinations went", n)
	}
	if p, ok := reports.entries.Load(keptToken); !ok || p.(interface{ Value() *Report }).Value() != kept {
		t.Fatal("the entry of a destination still in use is gone")
	}
	runtime.KeepAlive(kept)
}

// A call ends on the last attempt logged that did not lose a race: the
// records of the attempts its race cancelled, ended after it, say nothing
// of how it ended, and the backoff after it is its own.
func TestReportFinalSkipsLostAttempts(t *testing.T) {
	var r callReport
	r.begin("anthropic", "claude-sonnet-4-6", "", false, nil)
	if _, last, n := r.final(); last != (AttemptReport{}) || n != 0 {
		t.Fatalf("no attempt: final gave attempt %d, %+v", n, last)
	}
	if got := r.backoff(time.Second); got != (AttemptReport{}) {
		t.Fatalf("no attempt: backoff gave %+v", got)
	}
	failed := AttemptReport{StatusCode: 400, Class: NotRetryable, Kind: "client_error"}
	lost := AttemptReport{Class: NotRetryable, Kind: "hedge_lost", Lost: true, Hedge: true}
	r.record(1, failed)
	r.record(2, lost)
	if _, last, n := r.final(); last != failed || n != 1 {
		t.Fatalf("final gave attempt %d, %+v; want 1, %+v", n, last, failed)
	}
	if got := r.backoff(time.Second); got.StatusCode != 400 || got.Backoff != time.Second || r.AttemptLog[1].Backoff != 0 {
		t.Fatalf("backoff gave %+v; log %+v", got, r.AttemptLog)
	}
}
