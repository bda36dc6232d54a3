package redisstore

import (
	"strconv"
	"time"

	"github.com/damper-ai/damper-go/fleet"
)

// The values the scripts read and return, as Go reads and writes them:
// times as seconds and nanoseconds, floats as strings, integers.

// timeArgs is t as a script reads it: whole seconds since the Unix epoch
// and nanoseconds, or "z" for the zero time.
func timeArgs(t time.Time) (any, any) {
	if t.IsZero() {
		return "z", 0
	}
	return t.Unix(), t.Nanosecond()
}

// asTime reads a time a script returned as seconds and nanoseconds, in
// the location of like; nanoseconds of -1 are the zero time.
func asTime(vs []any, like time.Time, ok bool) (time.Time, bool) {
	if !ok || len(vs) != 2 {
		return time.Time{}, false
	}
	s, ok1 := asInt(vs[0])
	n, ok2 := asInt(vs[1])
	if !ok1 || !ok2 {
		return time.Time{}, false
	}
	if n == -1 {
		return time.Time{}, true
	}
	return time.Unix(s, n).In(like.Location()), true
}

func priorityArg(p fleet.Priority) int {
	if p == fleet.Batch {
		return 1
	}
	return 0
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func asInt(v any) (int64, bool) {
	i, ok := v.(int64)
	return i, ok
}

func asIntOK(v any, ok bool) (int64, bool) {
	if !ok {
		return 0, false
	}
	return asInt(v)
}

func asFloat(v any) (float64, bool) {
	s, ok := v.(string)
	if !ok {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	return f, err == nil
}

func asFloatOK(v any, ok bool) (float64, bool) {
	if !ok {
		return 0, false
	}
	return asFloat(v)
}
