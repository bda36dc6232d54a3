// Package conf reads a configuration struct from a JSON or YAML file, and
// from command-line flags, by the declaration of its fields' tags, as
// Damper's Policy is read: each setting is declared once, on its field,
//
//	DrainTimeout time.Duration `key:"drain_timeout" default:"30s" min:">0" max:"24h" flag:"drain-timeout" doc:"how long ..."`
//
// and from that alone its default is filled in, its bounds are checked
// (with the same message for a file's value and a flag's), and a usage
// text lists it. The tags:
//
//   - key: the field's key in a file; "-" for a field a file cannot hold
//     (a func, an interface); ",inline" for an embedded struct whose keys
//     are the enclosing struct's. Every exported field has one.
//   - default: the value a zero field takes, written as in a file ("60s",
//     "0.1", "3").
//   - min, max: the least and the largest value, inclusive; min ">0" for
//     "positive". On a map or a list, max bounds its number of entries.
//   - in: the whole range, as an interval: "(0,1]", "[1,1000]".
//   - unit: what the number counts, for messages ("bytes").
//   - zero: what 0 means in a field without a default ("no delay").
//   - none: the field takes None (-1 in Go, 0 in a file) for an explicit
//     0; the text says what it does ("means 0").
//   - enum: the names of an integer type's values, from 0, each with its
//     Go constant, which errors name: "fast:unset,slow:Slow" (the zero
//     value, a default with no name of its own, as "unset").
//   - doc, flag: what the setting does, and the name of its flag, for
//     [Settings] and [NewFlags].
//
// A key left out of a file means its default; a 0 written where the field
// has a default is an error. A type adds a check of its own (fields that
// bound each other, a value's syntax) with [Register].
//
// It is the engine of the damper command's files; the library's Policy
// files go through damper.ParsePolicyJSON and damper.ParsePolicyYAML.
package conf

import (
	"flag"
	"reflect"

	engine "github.com/damper-ai/damper-go/internal/conf"
)

// Error is a file that cannot be read: a document that is not JSON or
// YAML, or a key or value that is wrong. Its Path is the key's path, its
// parts joined with dots ("store.timeout", "backends[1].region"), "" for
// an error of the whole document; its Err says what is wrong, starting
// with the value as the file writes it.
type Error = engine.Error

// FieldError is a field whose value cannot be used, as [Fill] and the
// checks given to [Register] report it: Field is its path in Go, Key its
// path in a file, Value the value, Why what it must be (FileWhy, when set,
// says it to a file's writer), Default whether the value is the default.
// A check returns one naming a field of its own type; the engine
// completes the paths.
type FieldError = engine.FieldError

// Text is a value a [FieldError] shows as it is, unquoted: a
// description ("nothing", "(not shown)") in place of a value.
type Text = engine.Text

// Register adds a check of T, run by [Fill] and the decoding after T's
// fields are filled in and checked: p is the filled-in value, which the
// check may change further, given the value as it was before. Its error
// is best a [*FieldError] whose Field names a field of T, so that a
// file's error names the key. Call it from an init function.
func Register[T any](check func(p *T, given T) error) { engine.Register(check) }

// Fill fills in the struct ptr points to: it checks every field against
// its bounds, sets each zero field to its default, and runs the
// registered checks. The pointers, maps and slices it holds are replaced
// by copies. Its error is a [*FieldError] for the first field, in
// declaration order, that cannot be used.
func Fill(ptr any) error { return engine.Fill(ptr) }

// Defaults returns v filled in by [Fill]; it panics when Fill fails, which
// for a zero value means tags that contradict themselves.
func Defaults[T any](v T) T { return engine.Defaults(v) }

// DecodeJSON reads a JSON object into the struct ptr points to, strictly:
// an unknown or repeated key, a value of the wrong type or outside its
// field's bounds, and a value a registered check refuses are each an
// [*Error] naming the key's path and the value. The struct gets the
// values as the file has them, not filled in; on an error it is
// unchanged.
func DecodeJSON(data []byte, ptr any) error { return engine.DecodeJSON(data, ptr) }

// DecodeYAML reads a YAML document (or JSON) into the struct ptr points
// to, as [DecodeJSON] does; an empty document is the zero value.
func DecodeYAML(data []byte, ptr any) error { return engine.DecodeYAML(data, ptr) }

// Check reads the declaration of struct type t and of every struct it
// holds: it fails on a field with no key tag, a tag that does not parse, a
// default outside its bounds, and a number, duration, map or list with no
// max, since every value a file gives becomes memory or time. A test of
// each file's type calls it.
func Check(t reflect.Type) error { return engine.Check(t) }

// Setting is one key of a struct's file as its field's tags declare it:
// Key; Default as a file writes it ("30s"), "" for none; Range, what a
// value must be ("positive, at most 24h"), "" for any; Zero, what 0 means
// in a field with no default; Doc and Flag, its doc and flag tags. A
// command may complete the Settings of an inline struct whose fields are
// another package's before it gives them to [NewFlags].
type Setting = engine.Setting

// Settings returns the keys of struct type t, in declaration order, an
// inline struct's in its place: what a usage text lists.
func Settings(t reflect.Type) ([]Setting, error) { return engine.Settings(t) }

// Flags are the command-line flags of a struct's settings. Its Set
// method sets, in a struct of that type, the key of each flag given,
// checked as a file's value is ("--drain-timeout 0s: must be positive
// (leave the flag out for the default, 30s)"); its Name method names by
// its flag an [*Error] or a [*FieldError] of a key a flag set.
type Flags = engine.Flags

// NewFlags defines on fs a flag for each of settings (keys of struct type
// t) that has a Flag: a string, whole number, float, duration or bool
// flag, as its field is, with its Default and its Doc as its usage.
func NewFlags(fs *flag.FlagSet, t reflect.Type, settings []Setting) (*Flags, error) {
	return engine.NewFlags(fs, t, settings)
}
