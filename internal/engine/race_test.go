//go:build race

package engine

// raceEnabled is whether the tests run under the race detector, which
// adds allocations of its own: allocation counts are checked without it.
const raceEnabled = true
