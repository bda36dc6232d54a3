package engine

import (
	"strings"
	"testing"
	"time"
)

// The concurrency limit in a policy file: its keys, and errors that name
// the key and the value.
func TestConcurrencyPolicyFile(t *testing.T) {
	p, err := ParsePolicyYAML([]byte("concurrency:\n  adaptive: true\n  max: 300\n  tolerance: 2\n  max_wait: 500ms\n  priority: batch\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c := p.Concurrency; c == nil || !c.Adaptive || c.Max != 300 || c.Tolerance != 2 || c.MaxWait != 500*time.Millisecond || c.Priority != Batch {
		t.Fatalf("parsed %+v", p.Concurrency)
	}
	d, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	if c := d.Policy().Concurrency; c.Initial != 20 || c.Min != 1 || c.BatchShare != 0.8 {
		t.Errorf("filled in %+v, want initial 20, min 1, batch_share 0.8", c)
	}
	for _, tt := range []struct{ file, want string }{
		{"concurrency: {}", "concurrency.max: 0 (the default): a fixed limit needs a maximum; or make the limit adaptive"},
		{"concurrency: {adaptive: true, max: 10, initial: 20}", "concurrency.initial: 20: must not exceed max (10)"},
		{"concurrency: {adaptive: true, min: 30}", "concurrency.min: 30: must not exceed initial (20)"},
		{"concurrency: {max: 5, tolerance: 1}", "concurrency.tolerance: 1: must be in (1, 10]"},
		{"concurrency: {max: 100001}", "concurrency.max: 100001: must be at most 100000"},
		{"concurrency: {max: 5, priority: urgent}", "concurrency.priority"},
	} {
		if _, err := ParsePolicyYAML([]byte(tt.file)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err %v, want it to say %q", tt.file, err, tt.want)
		}
	}
	if _, err := New(Policy{Concurrency: &ConcurrencyPolicy{}}); err == nil || !strings.Contains(err.Error(), "Policy.Concurrency.Max = 0") {
		t.Errorf("New with a fixed limit and no Max: %v", err)
	}
}
