package damper

import (
	"runtime"
	"testing"
)

// A ReportInto option whose call never reaches Damper leaves no entry in
// the table of destinations once its destination is gone.
func TestReportTableForgets(t *testing.T) {
	count := func() int {
		n := 0
		reports.entries.Range(func(any, any) bool { n++; return true })
		return n
	}
	before := count()
	for range 100 {
		_ = ReportInto(new(Report))
	}
	if got := count(); got < before+100 {
		t.Fatalf("%d entries after 100 options, want at least %d", got, before+100)
	}
	for i := 0; i < 100 && count() > before; i++ {
		runtime.GC()
		runtime.Gosched()
	}
	if got := count(); got > before {
		t.Fatalf("%d entries left after the destinations went, want %d", got, before)
	}
}
