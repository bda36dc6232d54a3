// Package conf reads a configuration struct's declaration from its field
// tags, and from it alone fills in defaults, checks bounds, and reads and
// writes the struct as a JSON or YAML file. A field is declared once, on
// the struct:
//
//	MaxAttempts int `key:"max_attempts" default:"3" min:"1" max:"100"`
//
// The tags:
//
//   - key: the field's key in a file; "-" for a field a file cannot hold
//     (a func, an interface); ",inline" for an embedded struct whose keys
//     are the enclosing struct's. Every field has one.
//   - default: the value a zero field takes, written as in a file ("60s",
//     "0.1", "3").
//   - min, max: the least and the largest value, inclusive; min ">0" for
//     "positive". On a map, max bounds its number of entries.
//   - in: the whole range, as an interval: "(0,1]", "[1,1000]".
//   - unit: what the number counts, for messages ("bytes", "a share").
//   - none: the field takes None (-1) for an explicit 0; the text says what
//     None does ("means 0").
//   - zero: what 0 means in a field without a default ("no ceiling").
//   - enum: the names of an integer type's values, from 0, each with its
//     Go constant, which errors name: "fast:unset,slow:Slow" (the zero
//     value, a default with no name of its own, as "unset"). On a
//     string field, the values it may hold: "failover,spread" ("" too,
//     when it has a default).
//
// A zero field means its default; in a file, a key left out does. A value
// written 0 is None in a field that takes it, 0 where 0 means something
// (a field with no default), and an error elsewhere.
//
// A type may add a check of its own (fields that bound each other, keys of
// a map) with [Register]; it runs once the fields are filled in.
package conf

import (
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"
)

// None is the value of an explicit zero in a field that takes it.
const None = -1

// kind is how the engine handles a field.
type kind uint8

const (
	kindSkip kind = iota
	kindInt
	kindUint
	kindFloat
	kindDuration
	kindBool
	kindString
	kindEnum
	kindStructPtr
	kindInline
	kindMap
	kindSlice
)

var durationType = reflect.TypeFor[time.Duration]()

// field is one field of a struct, as its tags declare it.
type field struct {
	index int
	name  string // the Go name
	key   string
	kind  kind
	typ   reflect.Type

	def     reflect.Value // valid when the field has a default
	defText string

	hasLo, loExcl, hasHi, hiExcl, interval bool
	lo, hi                                 float64 // ints and durations convert exactly within the bounds used
	loText, hiText                         string

	unit  string
	none  string // "" when the field does not take None
	zero  string
	enum  []string // file names
	goEnm []string // Go constants
}

// schema is a struct type's fields, in order, and its check.
type schema struct {
	typ    reflect.Type
	fields []*field
	keys   map[string][]int // key -> path of field indexes, inline fields flattened
	order  []string         // keys in declaration order
	check  func(p, given reflect.Value) error
	err    error
}

var (
	mu      sync.Mutex
	schemas = map[reflect.Type]*schema{}
	checks  = map[reflect.Type]func(p, given reflect.Value) error{}
)

// Register adds a check of T, run after T's fields are filled in and
// checked: p is the filled-in value, which the check may change further,
// given the value as it was before. An error it returns is best a
// [*FieldError] whose Field names a field of T (`Limits["x"]` for a map's
// entry), so that a file's error can name the key.
func Register[T any](check func(p *T, given T) error) {
	mu.Lock()
	defer mu.Unlock()
	t := reflect.TypeFor[T]()
	checks[t] = func(p, given reflect.Value) error {
		return check(p.Addr().Interface().(*T), given.Interface().(T))
	}
	delete(schemas, t)
}

// schemaOf returns the schema of struct type t, read once.
func schemaOf(t reflect.Type) (*schema, error) {
	mu.Lock()
	defer mu.Unlock()
	return schemaLocked(t)
}

func schemaLocked(t reflect.Type) (*schema, error) {
	if s, ok := schemas[t]; ok {
		return s, s.err
	}
	s := &schema{typ: t, keys: map[string][]int{}, check: checks[t]}
	schemas[t] = s
	s.err = s.read()
	return s, s.err
}

func (s *schema) read() error {
	t := s.typ
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		f, err := readField(i, sf)
		if err != nil {
			return fmt.Errorf("conf: %s.%s: %w", t.Name(), sf.Name, err)
		}
		s.fields = append(s.fields, f)
		switch f.kind {
		case kindSkip:
		case kindInline:
			in, err := schemaLocked(f.typ)
			if err != nil {
				return err
			}
			for _, k := range in.order {
				s.addKey(k, append([]int{i}, in.keys[k]...))
			}
		default:
			s.addKey(f.key, []int{i})
		}
	}
	for _, k := range s.order {
		if s.keys[k] == nil {
			return fmt.Errorf("conf: %s: key %q declared twice", t.Name(), k)
		}
	}
	return nil
}

func (s *schema) addKey(k string, path []int) {
	if _, ok := s.keys[k]; ok {
		s.keys[k] = nil // reported by read
		return
	}
	s.keys[k] = path
	s.order = append(s.order, k)
}

// readField reads the tags of one field.
func readField(i int, sf reflect.StructField) (*field, error) {
	key, ok := sf.Tag.Lookup("key")
	if !ok {
		return nil, fmt.Errorf("no key tag")
	}
	f := &field{index: i, name: sf.Name, key: key, typ: sf.Type}
	if key == "-" {
		f.kind = kindSkip
		return f, nil
	}
	if key == ",inline" {
		if !sf.Anonymous || sf.Type.Kind() != reflect.Struct {
			return nil, fmt.Errorf(",inline on a field that is not an embedded struct")
		}
		f.kind = kindInline
		return f, nil
	}
	if key == "" || strings.ContainsAny(key, ".[]\" ") {
		return nil, fmt.Errorf("key %q: want a name of letters, digits and _", key)
	}
	t := sf.Type
	f.unit, f.none, f.zero = sf.Tag.Get("unit"), sf.Tag.Get("none"), sf.Tag.Get("zero")
	switch {
	case t == durationType:
		f.kind = kindDuration
	case sf.Tag.Get("enum") != "" && t.Kind() == reflect.String:
		f.kind = kindString
		f.enum = strings.Split(sf.Tag.Get("enum"), ",")
	case sf.Tag.Get("enum") != "":
		f.kind = kindEnum
		for _, e := range strings.Split(sf.Tag.Get("enum"), ",") {
			name, goName, ok := strings.Cut(e, ":")
			if !ok {
				return nil, fmt.Errorf("enum %q: want name:GoName, ...", e)
			}
			f.enum, f.goEnm = append(f.enum, name), append(f.goEnm, goName)
		}
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int64:
		f.kind = kindInt
	case t.Kind() == reflect.Float64:
		f.kind = kindFloat
	case t.Kind() == reflect.Bool:
		f.kind = kindBool
	case t.Kind() == reflect.String:
		f.kind = kindString
	case t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct:
		f.kind = kindStructPtr
	case t.Kind() == reflect.Map && t.Key().Kind() == reflect.String:
		f.kind = kindMap
		if err := elemSupported(t); err != nil {
			return nil, err
		}
	case t.Kind() == reflect.Slice:
		f.kind = kindSlice
		if err := elemSupported(t); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("type %v: not a kind a file holds; tag it key:\"-\"", t)
	}
	if f.none != "" && f.kind != kindInt && f.kind != kindFloat && f.kind != kindDuration {
		return nil, fmt.Errorf("none on a %v", t)
	}
	if d, ok := sf.Tag.Lookup("default"); ok {
		v := reflect.New(t).Elem()
		if err := parseScalar(f, d, v); err != nil {
			return nil, fmt.Errorf("default %q: %w", d, err)
		}
		if v.IsZero() {
			return nil, fmt.Errorf("default %q: the zero value needs no default", d)
		}
		f.def, f.defText = v, d
	}
	if in := sf.Tag.Get("in"); in != "" {
		if err := f.readInterval(in); err != nil {
			return nil, err
		}
	}
	if lo := sf.Tag.Get("min"); lo != "" {
		f.hasLo = true
		if rest, ok := strings.CutPrefix(lo, ">"); ok {
			f.loExcl, lo = true, rest
		}
		x, err := boundOf(f, lo)
		if err != nil {
			return nil, fmt.Errorf("min %q: %w", lo, err)
		}
		f.lo, f.loText = x, lo
	}
	if hi := sf.Tag.Get("max"); hi != "" {
		x, err := boundOf(f, hi)
		if err != nil {
			return nil, fmt.Errorf("max %q: %w", hi, err)
		}
		f.hasHi, f.hi, f.hiText = true, x, hi
	}
	if f.def.IsValid() && f.outside(f.def) != "" {
		return nil, fmt.Errorf("default %s: %s", f.defText, f.outside(f.def))
	}
	return f, nil
}

func elemSupported(t reflect.Type) error {
	switch e := t.Elem(); {
	case e.Kind() == reflect.String:
	case e.Kind() == reflect.Struct:
	case e.Kind() == reflect.Slice && e.Elem().Kind() == reflect.String:
	default:
		return fmt.Errorf("type %v: not a kind a file holds", t)
	}
	return nil
}

// readInterval reads an in tag: "(0,1]".
func (f *field) readInterval(in string) error {
	if len(in) < 5 || !strings.Contains("([", in[:1]) || !strings.Contains(")]", in[len(in)-1:]) {
		return fmt.Errorf("in %q: want an interval such as (0,1]", in)
	}
	lo, hi, ok := strings.Cut(in[1:len(in)-1], ",")
	if !ok {
		return fmt.Errorf("in %q: want an interval such as (0,1]", in)
	}
	lo, hi = strings.TrimSpace(lo), strings.TrimSpace(hi)
	var err error
	if f.lo, err = boundOf(f, lo); err != nil {
		return fmt.Errorf("in %q: %w", in, err)
	}
	if f.hi, err = boundOf(f, hi); err != nil {
		return fmt.Errorf("in %q: %w", in, err)
	}
	f.interval, f.hasLo, f.hasHi = true, true, true
	f.loExcl, f.hiExcl = in[0] == '(', in[len(in)-1] == ')'
	f.loText, f.hiText = lo, hi
	return nil
}

// boundOf reads a bound written as the field's values are.
func boundOf(f *field, s string) (float64, error) {
	switch f.kind {
	case kindDuration:
		d, err := time.ParseDuration(s)
		return float64(d), err
	case kindInt, kindFloat, kindMap, kindSlice:
		return strconv.ParseFloat(s, 64)
	}
	return 0, fmt.Errorf("a %v has no bounds", f.typ)
}

// parseScalar reads s, written as a file's value, into v.
func parseScalar(f *field, s string, v reflect.Value) error {
	switch f.kind {
	case kindDuration:
		d, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		v.SetInt(int64(d))
	case kindInt:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return err
		}
		v.SetInt(n)
	case kindFloat:
		x, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return err
		}
		v.SetFloat(x)
	case kindBool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return err
		}
		v.SetBool(b)
	case kindString:
		v.SetString(s)
	default:
		return fmt.Errorf("a %v takes no default", f.typ)
	}
	return nil
}

// number returns a numeric field's value as a float64, exact within the
// bounds (an int above 2^53 is past every max anyway).
func number(v reflect.Value) float64 {
	switch v.Kind() {
	case reflect.Float64:
		return v.Float()
	case reflect.Map, reflect.Slice:
		return float64(v.Len())
	}
	return float64(v.Int())
}

// outside returns, for a value outside the field's bounds, what it must
// be; "" when it is inside.
func (f *field) outside(v reflect.Value) string {
	switch f.kind {
	case kindEnum:
		var i int64
		if v.CanInt() {
			i = v.Int()
		} else {
			i = int64(min(v.Uint(), math.MaxInt64))
		}
		if i < 0 || i >= int64(len(f.enum)) {
			return "must be " + orList(f.goEnm)
		}
		return ""
	case kindInt, kindFloat, kindDuration, kindMap, kindSlice:
	default:
		return ""
	}
	x := number(v)
	if f.kind == kindInt && v.Int() > 1<<53 && f.hasHi {
		return f.above()
	}
	low := math.IsNaN(x) || math.IsInf(x, 0) ||
		f.hasLo && (x < f.lo || f.loExcl && x == f.lo)
	switch {
	case low:
		return f.below()
	case f.hasHi && (x > f.hi || f.hiExcl && x == f.hi):
		return f.above()
	}
	return ""
}

// below says what a value below the field's range must be.
func (f *field) below() string {
	if f.interval {
		return f.whole()
	}
	if f.kind == kindFloat {
		s := "must be a finite number"
		if f.unit != "" {
			s += " of " + f.unit
		}
		switch {
		case !f.hasLo:
			return s
		case f.loExcl:
			return s + ", above " + f.loText
		}
		return s + ", at least " + f.loText
	}
	if f.loExcl && f.lo == 0 {
		if f.unit != "" {
			return "must be a positive number of " + f.unit
		}
		return "must be positive"
	}
	if f.loExcl {
		return "must be above " + f.loText
	}
	return "must be at least " + f.loText
}

// above says what a value above the field's range must be.
func (f *field) above() string {
	if f.interval {
		return f.whole()
	}
	switch f.kind {
	case kindDuration:
		return fmt.Sprintf("must be at most %v", time.Duration(f.hi))
	case kindFloat:
		return fmt.Sprintf("must be at most %v", f.hi)
	}
	return fmt.Sprintf("must be at most %d", int64(f.hi))
}

func (f *field) whole() string {
	lb, rb := "[", "]"
	if f.loExcl {
		lb = "("
	}
	if f.hiExcl {
		rb = ")"
	}
	s := "must be in "
	if f.unit != "" {
		s = "must be " + f.unit + " in "
	}
	return s + lb + f.loText + ", " + f.hiText + rb
}

// zeroMeans is what a 0 means in the field, for a Go value's message.
func (f *field) zeroMeans() string {
	switch {
	case f.def.IsValid() && f.none != "":
		return " (0 means the default, " + f.defText + "; None " + f.none + ")"
	case f.def.IsValid():
		return " (0 means the default, " + f.defText + ")"
	case f.zero != "":
		return " (0 means " + f.zero + ")"
	}
	return ""
}

// absentMeans is what leaving the key (or the flag: what) out means, for
// a file's message or a flag's.
func (f *field) absentMeans(what string) string {
	switch {
	case f.def.IsValid():
		return " (leave the " + what + " out for the default, " + f.defText + ")"
	case f.zero != "":
		return " (0 means " + f.zero + ")"
	}
	return ""
}

// zeroIsWrong reports whether a 0 written in a file is an error: the
// field has a default, and takes no None.
func (f *field) zeroIsWrong() bool { return f.def.IsValid() && f.none == "" }

func orList(names []string) string {
	switch len(names) {
	case 0:
		return "nothing"
	case 1:
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

func quoteList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return orList(q)
}
