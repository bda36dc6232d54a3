package main

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The calls a measurement makes.
const (
	plainBody  = `{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[{"role":"user","content":"hello"}]}`
	streamBody = `{"model":"claude-sonnet-4-6","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hello"}]}`
)

// measure makes warmup calls, then requests calls from clients goroutines
// in a closed loop, to c, and reads what c's processes spent meanwhile.
// A contender whose processes spent fewer than minTicks of CPU meanwhile
// gets more batches of requests calls, up to batches in all, so that a
// cheap one (nginx) is measured as exactly as the others: its throughput,
// CPU and latencies are then those of every batch.
func measure(c contender, kind string, clients, warmup, requests, batches int) (result, error) {
	body := plainBody
	if kind == "stream" {
		body = streamBody
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost, tr.DisableCompression = 2*clients, 2*clients, true
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	if _, _, err := load(client, c.base, body, clients, warmup); err != nil {
		return result{}, fmt.Errorf("warm-up: %w", err)
	}
	var before, after cpuMem
	if c.pids != nil {
		var err error
		if before, err = readProcs(c.pids()); err != nil {
			return result{}, err
		}
	}
	var r result
	var lat []time.Duration
	var elapsed time.Duration
	for batch := 1; ; batch++ {
		t0 := time.Now()
		l, failed, err := load(client, c.base, body, clients, requests)
		elapsed += time.Since(t0)
		if err != nil {
			return result{}, err
		}
		lat, r.failed = append(lat, l...), r.failed+failed
		if c.pids == nil {
			break
		}
		if after, err = readProcs(c.pids()); err != nil {
			return result{}, err
		}
		r.cpuTicks = int64((after.cpu - before.cpu) / clockTick)
		if r.cpuTicks >= minTicks || batch >= batches {
			break
		}
	}
	r.calls = len(lat)
	r.rps = float64(r.calls) / elapsed.Seconds()
	if c.pids != nil {
		r.cpuPerCall = (after.cpu - before.cpu).Seconds() * 1e6 / float64(len(lat))
		r.rss = after.rssMB
	}
	slices.Sort(lat)
	r.p50, r.p99 = lat[len(lat)/2], lat[len(lat)*99/100]
	return r, nil
}

// load makes n calls from clients goroutines, each after the last one's
// answer was read whole, and returns their latencies and the count that
// failed; too many failures is an error.
func load(client *http.Client, base, body string, clients, n int) ([]time.Duration, int, error) {
	var next, failed atomic.Int64
	var firstErr atomic.Value
	lat := make([]time.Duration, n)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				t0 := time.Now()
				if err := call(client, base, body); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
				lat[i] = time.Since(t0)
			}
		})
	}
	wg.Wait()
	if f := failed.Load(); f > int64(n)/100 {
		return nil, int(f), fmt.Errorf("%d of %d calls failed, the first: %v", f, n, firstErr.Load())
	}
	return lat, int(failed.Load()), nil
}

// call makes one Messages call and reads its answer whole.
func call(client *http.Client, base, body string) error {
	req, err := http.NewRequest(http.MethodPost, base+"/v1/messages", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("X-Api-Key", "bench-key")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	req.Header.Set("Content-Type", "application/json")
	res, err := client.Do(req)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if err == nil && res.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %d", res.StatusCode)
	}
	return err
}
