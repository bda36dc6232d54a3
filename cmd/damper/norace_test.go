//go:build !race

package main

// raceEnabled is whether the tests run under the race detector, whose
// shadow memory makes a process's resident set no measure of its own:
// memory bounds are checked without it.
const raceEnabled = false
