package damper

import (
	"runtime"
	"testing"
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
