package engine

import (
	"strconv"
	"testing"
)

// An optionCache keeps the first maxCachedOptions combinations and no
// more; a combination it holds is found without allocating.
func TestOptionCacheBounded(t *testing.T) {
	var c optionCache[string, int]
	for i := range maxCachedOptions + 10 {
		k := strconv.Itoa(i)
		if _, ok := c.load(k); ok {
			t.Fatalf("%s found before it was stored", k)
		}
		c.store(k, i)
	}
	if n := len(*c.seen.Load()); n != maxCachedOptions {
		t.Errorf("the cache holds %d combinations, want %d", n, maxCachedOptions)
	}
	if v, ok := c.load("7"); !ok || v != 7 {
		t.Errorf("load(7) = %d, %v; want 7, true", v, ok)
	}
	if _, ok := c.load(strconv.Itoa(maxCachedOptions)); ok {
		t.Error("a combination past the bound was kept")
	}
	c.store("7", 70) // the first value stays
	if v, _ := c.load("7"); v != 7 {
		t.Errorf("load(7) = %d after a second store, want 7", v)
	}
	if n := testing.AllocsPerRun(100, func() { c.load("7") }); n != 0 {
		t.Errorf("a load allocates %v times", n)
	}
}
