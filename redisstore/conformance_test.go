package redisstore_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"testing"
	"time"

	"github.com/damper-ai/damper-go/fleet"
	"github.com/damper-ai/damper-go/fleet/fleettest"
	"github.com/damper-ai/damper-go/internal/redistest"
	"github.com/damper-ai/damper-go/redisstore"
	"github.com/redis/go-redis/v9"
)

// conformanceTimeout is each store's Options.Timeout: long enough that a
// loaded machine running the race detector never falls back by chance,
// short enough for the fault checks.
const conformanceTimeout = 250 * time.Millisecond

// conformance runs fleettest's suite on stores over the servers: the
// stores of one subtest are processes of one fleet, on one Name (each
// with a client of its own); a fault pauses every server (SIGSTOP).
func conformance(t *testing.T, servers []*redistest.Server, cluster bool, o redisstore.Options) {
	run := strconv.FormatInt(time.Now().UnixNano(), 36) // a rerun's keys are new
	newStore := func(t *testing.T) fleet.Store {
		sum := sha256.Sum256([]byte(t.Name()))
		var client redis.UniversalClient
		if cluster {
			// MaxRedirects keeps its default: it follows MOVED and ASK.
			client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.Addrs(servers), ContextTimeoutEnabled: true, MaxRetries: -1})
		} else {
			client = redis.NewClient(&redis.Options{Addr: servers[0].Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
		}
		t.Cleanup(func() { client.Close() })
		so := o
		so.Name = "ft-" + run + "-" + hex.EncodeToString(sum[:8])
		so.Timeout = conformanceTimeout
		s, err := redisstore.New(client, so)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	fleettest.Run(t, newStore, fleettest.Options{
		Shared:     true,
		Lease:      o.Lease,
		FailClosed: o.FailClosed,
		// A decision behind a batch in flight waits two timeouts.
		MaxWait: 2*conformanceTimeout + time.Second,
		Fault: func(t *testing.T) func() {
			for _, s := range servers {
				s.Pause()
			}
			return func() {
				for _, s := range servers {
					s.Resume()
				}
			}
		},
	})
}

// TestConformance: a Store keeps fleet's contract for every part, on one
// redis-server, with leases, and failing closed.
func TestConformance(t *testing.T) {
	servers := []*redistest.Server{redistest.Start(t)}
	t.Run("redis", func(t *testing.T) { conformance(t, servers, false, redisstore.Options{}) })
	t.Run("lease", func(t *testing.T) { conformance(t, servers, false, redisstore.Options{Lease: 5}) })
	t.Run("fail_closed", func(t *testing.T) { conformance(t, servers, false, redisstore.Options{FailClosed: true}) })
}

// TestConformanceOnCluster: the same on a Redis Cluster of three
// masters, through a ClusterClient.
func TestConformanceOnCluster(t *testing.T) {
	conformance(t, redistest.StartCluster(t, 3), true, redisstore.Options{})
}
