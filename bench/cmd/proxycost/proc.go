package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// cpuMem is what a set of processes spent: CPU time, user and system, and
// their resident memory now.
type cpuMem struct {
	cpu   time.Duration
	rssMB float64
}

// clockTick is the unit of /proc/<pid>/stat's times: USER_HZ, 100 on
// every Linux architecture Go runs on.
const clockTick = 10 * time.Millisecond

// minTicks is the CPU a measurement should read for its CPU per call to be
// within 1 %: a measurement reads two counts of whole ticks, each off by
// up to one. The default run's 20,000 calls at some 100 µs a call read
// about 200; nginx, at some 25 µs, takes three batches of them (measure).
const minTicks = 100

// maxBatches bounds -batches.
const maxBatches = 100

// readProcs sums the CPU time and RSS of pids.
func readProcs(pids []int) (cpuMem, error) {
	var m cpuMem
	for _, pid := range pids {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return m, fmt.Errorf("%w: %v", errNoProc, err)
		}
		f := statFields(stat)
		if len(f) < 13 {
			return m, fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(f))
		}
		// utime and stime: the 14th and 15th fields, the 12th and 13th
		// after the name.
		ut, err1 := strconv.ParseInt(f[11], 10, 64)
		st, err2 := strconv.ParseInt(f[12], 10, 64)
		if err1 != nil || err2 != nil {
			return m, fmt.Errorf("/proc/%d/stat: utime %q, stime %q", pid, f[11], f[12])
		}
		m.cpu += time.Duration(ut+st) * clockTick
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			return m, err
		}
		for line := range strings.Lines(string(status)) {
			if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
				m.rssMB += kb / 1024
			}
		}
	}
	return m, nil
}

// statFields are the fields of a /proc/<pid>/stat line after the process's
// name, which may hold spaces and parentheses.
func statFields(stat []byte) []string {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(stat[i+1:]))
}

// parentOf is the parent of pid, or 0.
func parentOf(pid int) int {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := statFields(stat)
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// parsePid reads a /proc entry's name as a pid.
func parsePid(name string) (int, bool) {
	pid, err := strconv.Atoi(name)
	return pid, err == nil && pid > 0
}
