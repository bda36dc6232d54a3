package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/maphash"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Cache affinity: under spread routing, a call whose prompt has a cache
// breakpoint starts on the backend that last served the same cached
// prefix, while that backend has headroom: prompt caches live per account,
// so a prefix that moves is written again, at full input price, where it
// lands.
//
// The prefix is the prompt in the order the cache reads it (tools, system,
// messages) up to its first breakpoint: caches are hierarchical, every
// later breakpoint's prefix extends the first one's, and the first is
// what repeated calls share most (a system prompt and tools, whatever the
// conversation). Automatic caching (a top-level cache_control) places its
// breakpoint on the last block, which moves on every turn; its first
// turn's breakpoint, the end of the first message, is the prefix that
// every later turn of a conversation shares, so it counts as a breakpoint
// there.

// The results of a call's look-up in the affinity table, in
// damper.routing.affinity, on the damper.request span and in
// Report.CacheAffinity.
const (
	affinityHit   = "hit"   // it starts on the table's backend
	affinityMoved = "moved" // the table's backend lacked headroom or was refused
	affinityNew   = "new"   // the table had no entry for the prefix
)

// affinityFloor is the headroom (backend.headroom: the least share left of
// a backend's known limits) below which a prefix leaves its backend for
// the spread's choice: with a tenth of its tightest limit left, a burst
// would wait in its rate limiter's line or meet a 429.
const affinityFloor = 0.1

// affinity is the table of the backends that last served each cached
// prefix, by its key (promptKey): at most max entries, the least recently
// used evicted first. Its memory is bounded whatever the callers send.
type affinity struct {
	max int
	mu  sync.Mutex
	// index finds an entry's slot; slots hold the entries, in a list from
	// head (the most recently used) to tail, linked by slot number.
	index      map[uint64]int32
	slots      []affinitySlot
	head, tail int32 // -1 when empty
}

type affinitySlot struct {
	key        uint64
	b          *backend
	prev, next int32 // -1 at the ends
}

// newAffinity makes a table of at most max entries.
func newAffinity(max int) *affinity {
	return &affinity{max: max, index: make(map[uint64]int32), head: -1, tail: -1}
}

// lookup returns the backend that last served the prefix of key, and uses
// the entry.
func (a *affinity) lookup(key uint64) (*backend, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	i, ok := a.index[key]
	if !ok {
		return nil, false
	}
	a.touch(i)
	return a.slots[i].b, true
}

// record notes that b served the prefix of key, evicting the least
// recently used entry when the table is full.
func (a *affinity) record(key uint64, b *backend) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if i, ok := a.index[key]; ok {
		a.slots[i].b = b
		a.touch(i)
		return
	}
	var i int32
	if len(a.slots) < a.max {
		i = int32(len(a.slots))
		a.slots = append(a.slots, affinitySlot{prev: -1, next: -1})
	} else {
		i = a.tail
		a.unlink(i)
		delete(a.index, a.slots[i].key)
	}
	a.slots[i].key, a.slots[i].b = key, b
	a.index[key] = i
	a.pushFront(i)
}

// len is the number of entries.
func (a *affinity) len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.index)
}

// touch makes slot i the most recently used; under mu.
func (a *affinity) touch(i int32) {
	if a.head != i {
		a.unlink(i)
		a.pushFront(i)
	}
}

func (a *affinity) unlink(i int32) {
	s := &a.slots[i]
	if s.prev >= 0 {
		a.slots[s.prev].next = s.next
	} else {
		a.head = s.next
	}
	if s.next >= 0 {
		a.slots[s.next].prev = s.prev
	} else {
		a.tail = s.prev
	}
	s.prev, s.next = -1, -1
}

func (a *affinity) pushFront(i int32) {
	s := &a.slots[i]
	s.prev, s.next = -1, a.head
	if a.head >= 0 {
		a.slots[a.head].prev = i
	}
	a.head = i
	if a.tail < 0 {
		a.tail = i
	}
}

// affinitySeed seeds the prefixes' hash: random per process, so that no
// caller can make two prefixes collide on purpose.
var affinitySeed = maphash.MakeSeed()

// promptSections are where a body's members that make the cached prefix
// lie: each value's start and end in the body (end 0 when absent, the
// first of duplicate members counting), and whether it has a top-level
// cache_control that is not null (automatic caching).
type promptSections struct {
	tools, system, messages [2]int
	automatic, seenAuto     bool
}

// note notes the top-level member key whose value is body[start:end].
func (s *promptSections) note(key, value []byte, start, end int) {
	var at *[2]int
	switch string(key) {
	case "tools":
		at = &s.tools
	case "system":
		at = &s.system
	case "messages":
		at = &s.messages
	case "cache_control":
		if !s.seenAuto {
			s.seenAuto, s.automatic = true, string(value) != "null"
		}
		return
	default:
		return
	}
	if at[1] == 0 {
		*at = [2]int{start, end}
	}
}

// The sections of a prompt, in the cache's order.
const (
	sectionNone = iota
	sectionTools
	sectionSystem
	sectionMessages
)

// breakpoint is where a prompt's cached prefix ends: in section, after
// element index of it (a tool, a system block, a message), and for a
// message after its content block block (-1: the whole message); end is
// the offset in the body where the prefix ends.
type breakpoint struct {
	section, index, block, end int
}

// cacheControl is the key whose presence marks a breakpoint.
var cacheControl = []byte(`"cache_control"`)

// key returns the key of the cached prefix of body, whose model is model:
// a hash of the model and the prompt's bytes up to its first breakpoint;
// 0 when it has none. It reads only what body holds, and allocates
// nothing.
func (s *promptSections) key(body []byte, model string) uint64 {
	bp := s.breakpoint(body)
	if bp.section == sectionNone {
		return 0
	}
	// Each part is written after its length, so that no two prompts
	// write the same bytes.
	var h maphash.Hash
	h.SetSeed(affinitySeed)
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(model)))
	_, _ = h.Write(n[:])
	_, _ = h.WriteString(model)
	for i, at := range [...][2]int{s.tools, s.system, s.messages} {
		if i+1 > bp.section {
			break
		}
		end := at[1]
		if i+1 == bp.section {
			end = bp.end
		}
		binary.LittleEndian.PutUint64(n[:], uint64(end-at[0]))
		_, _ = h.Write(n[:])
		_, _ = h.Write(body[at[0]:end])
	}
	k := h.Sum64()
	if k == 0 {
		k = 1 // 0 means none
	}
	return k
}

// breakpoint finds the first breakpoint of the prompt: a cache_control,
// not null, on a tool, a system block or a message's content block; or,
// with automatic caching and none before, the end of the first message.
func (s *promptSections) breakpoint(body []byte) breakpoint {
	if !s.automatic && !bytes.Contains(body, cacheControl) {
		return breakpoint{} // the common case: one byte search
	}
	mentions := func(at [2]int) bool {
		return at[1] > 0 && bytes.Contains(body[at[0]:at[1]], cacheControl)
	}
	if mentions(s.tools) {
		if i, end := marked(body, s.tools); i >= 0 {
			return breakpoint{section: sectionTools, index: i, block: -1, end: end}
		}
	}
	if mentions(s.system) {
		if i, end := marked(body, s.system); i >= 0 {
			return breakpoint{section: sectionSystem, index: i, block: -1, end: end}
		}
	}
	if s.messages[1] == 0 || !s.automatic && !mentions(s.messages) {
		return breakpoint{}
	}
	list := jsonElems{s: BodyScan{Body: body}, i: s.messages[0], end: s.messages[1]}
	if !list.open('[') {
		return breakpoint{}
	}
	for i := 0; ; i++ {
		start, end, ok := list.next()
		if !ok {
			return breakpoint{}
		}
		if content, ok := member(body, start, end, "content"); ok && body[content[0]] == '[' {
			if j, blockEnd := marked(body, content); j >= 0 {
				return breakpoint{section: sectionMessages, index: i, block: j, end: blockEnd}
			}
		}
		if i == 0 && s.automatic {
			return breakpoint{section: sectionMessages, index: 0, block: -1, end: end}
		}
	}
}

// marked returns the index of the first element of the array at[0]:at[1]
// of body that is an object with a cache_control member that is not null,
// and the offset after it; -1 when none is, or the value is no array.
func marked(body []byte, at [2]int) (int, int) {
	list := jsonElems{s: BodyScan{Body: body}, i: at[0], end: at[1]}
	if !list.open('[') {
		return -1, 0
	}
	for i := 0; ; i++ {
		start, end, ok := list.next()
		if !ok {
			return -1, 0
		}
		if v, ok := member(body, start, end, "cache_control"); ok && string(body[v[0]:v[1]]) != "null" {
			return i, end
		}
	}
}

// member returns where the value of the first member named name of the
// object body[start:end] lies; false when it has none, or is no object.
// A key with an escape is not read.
func member(body []byte, start, end int, name string) ([2]int, bool) {
	obj := jsonElems{s: BodyScan{Body: body}, i: start, end: end}
	if !obj.open('{') {
		return [2]int{}, false
	}
	for {
		k, kEnd, ok := obj.next()
		if !ok || body[k] != '"' {
			return [2]int{}, false
		}
		i := SkipSpace(body, kEnd)
		if i >= end || body[i] != ':' {
			return [2]int{}, false
		}
		obj.i = i + 1
		v, vEnd, ok := obj.next()
		if !ok {
			return [2]int{}, false
		}
		if string(body[k+1:kEnd-1]) == name {
			return [2]int{v, vEnd}, true
		}
	}
}

// jsonElems walks the values of a JSON array or the keys and values of an
// object, in body[i:end], skipping each whole (BodyScan.value: nesting is
// counted, not recursed into).
type jsonElems struct {
	s      BodyScan
	i, end int
}

// open steps into the array or object (bracket) that starts at e.i.
func (e *jsonElems) open(bracket byte) bool {
	if e.i >= e.end || e.s.Body[e.i] != bracket {
		return false
	}
	e.i++
	return true
}

// next returns where the next value lies, and steps past it and a comma
// after it; false at the end or at anything it cannot read.
func (e *jsonElems) next() (start, end int, ok bool) {
	b := e.s.Body
	start = SkipSpace(b, e.i)
	if start >= e.end || b[start] == ']' || b[start] == '}' {
		return 0, 0, false
	}
	end = e.s.Value(start)
	if end < 0 || end > e.end {
		return 0, 0, false
	}
	e.i = SkipSpace(b, end)
	if e.i < e.end && b[e.i] == ',' {
		e.i++
	}
	return start, end, true
}

// metricRoutingAffinity counts spread calls with a cached prefix by what
// the affinity table said.
const metricRoutingAffinity = "damper.routing.affinity"

// Attributes of cache affinity: the metric's, and the damper.request
// span's.
const (
	keyRoutingResult   = attribute.Key("damper.routing.result")
	keyRoutingAffinity = attribute.Key("damper.routing.affinity")
)

// newRoutingAffinity makes the counter of the affinity table's answers.
func newRoutingAffinity(meter metric.Meter) metric.Int64Counter {
	var none noop.Meter
	return instrument(meter.Int64Counter(metricRoutingAffinity, metric.WithUnit("{call}"),
		metric.WithDescription("Calls under spread routing whose prompt has a cache breakpoint, by what cache affinity did: hit (started on the backend that last served the prefix), moved (that backend lacked headroom or was refused), new (no backend had served it).")))(none.Int64Counter(metricRoutingAffinity))
}

// affinity counts a call's look-up in the affinity table, whose result
// was result.
func (m *metrics) affinity(ctx context.Context, result string) {
	if m.routingAffinity != nil && m.routingAffinity.Enabled(ctx) {
		m.routingAffinity.Add(ctx, 1, m.attrs(keyRoutingResult.String(result)))
	}
}
