package conf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"time"

	yamlv2 "go.yaml.in/yaml/v2"
	"sigs.k8s.io/yaml"
)

// Error is a file that cannot be read: a document that is not JSON or
// YAML, or a key or value that is wrong.
type Error struct {
	// Path is the key's path, its parts joined with dots:
	// "breaker.open_for", "rate_limit.limits.claude-sonnet-4.requests_per_minute";
	// "" for an error of the whole document.
	Path string
	Err  error
}

func (e *Error) Error() string {
	if e.Path == "" {
		return e.Err.Error()
	}
	return e.Path + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

func errorAt(path string, format string, args ...any) *Error {
	return &Error{Path: path, Err: fmt.Errorf(format, args...)}
}

// DecodeYAML reads a YAML document (or JSON but for tabs) into the struct
// ptr points to, as [DecodeJSON] does. An empty document is the zero
// value. YAML 1.1 reads an unquoted yes, no, on or off as a boolean.
func DecodeYAML(data []byte, ptr any) error {
	// The conversion to JSON finds a repeated key but not its path, and
	// merges two keys that only YAML tells apart, such as 1 and "1": look
	// for both first, in a decoding that keeps every key in order.
	var doc yamlv2.MapSlice
	if yamlv2.Unmarshal(data, &doc) == nil {
		if path, ok := repeatedKey(doc, ""); ok {
			return errorAt(path, "repeated key")
		}
	}
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		var unsupported *json.UnsupportedValueError
		if errors.As(err, &unsupported) { // .nan, .inf
			err = fmt.Errorf("%s: no key takes a value that is not a finite number", unsupported.Str)
		}
		return &Error{Err: err}
	}
	return DecodeJSON(j, ptr)
}

// repeatedKey returns the path of the first key, in document order, that
// a mapping of v repeats once written as JSON writes it.
func repeatedKey(v any, path string) (string, bool) {
	switch v := v.(type) {
	case yamlv2.MapSlice:
		seen := make(map[string]bool, len(v))
		for _, item := range v {
			key := fmt.Sprint(item.Key)
			keyPath := joinPath(path, key)
			if seen[key] {
				return keyPath, true
			}
			seen[key] = true
			if p, ok := repeatedKey(item.Value, keyPath); ok {
				return p, true
			}
		}
	case []any:
		for i, elem := range v {
			if p, ok := repeatedKey(elem, fmt.Sprintf("%s[%d]", path, i)); ok {
				return p, true
			}
		}
	}
	return "", false
}

// DecodeJSON reads a JSON object into the struct ptr points to, strictly:
// an unknown or repeated key, a value of the wrong type or outside its
// field's bounds, and a value the registered checks refuse are each an
// [*Error] naming the key's path and the value. The struct gets the
// values as the file has them (a key left out is a zero field, a 0 in a
// field that takes None is None), not filled in. null is the zero value.
// On an error the struct is unchanged.
func DecodeJSON(data []byte, ptr any) error {
	var raw json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) {
			line, col := lineColumn(data, syntax.Offset)
			return &Error{Err: fmt.Errorf("line %d, column %d: %w", line, col, err)}
		}
		return &Error{Err: err}
	}
	d := decoder{dec: json.NewDecoder(bytes.NewReader(raw)), read: read{present: map[string]bool{}, bad: map[string]error{}}}
	d.dec.UseNumber()
	tok, err := d.dec.Token()
	if err != nil {
		return &Error{Err: err}
	}
	target := reflect.ValueOf(ptr).Elem()
	v := reflect.New(target.Type()).Elem()
	if tok != nil {
		if err := d.decodeStruct(tok, "", v); err != nil {
			return err
		}
		if _, err := d.dec.Token(); err != io.EOF {
			return errorAt("", "more data after the document")
		}
	}
	filled := reflect.New(v.Type()).Elem()
	filled.Set(v)
	if err := fill(filled, at{}, &d.read); err != nil {
		var fe *FieldError
		var ce *Error
		if errors.As(err, &ce) {
			return ce
		}
		if errors.As(err, &fe) {
			return &Error{Path: fe.Key, Err: fe.FileError()}
		}
		return &Error{Err: err}
	}
	target.Set(v)
	return nil
}

// lineColumn returns the line and column, from 1, of byte offset in data;
// offset counts the bytes read, so the byte at fault is the one before it.
func lineColumn(data []byte, offset int64) (line, col int) {
	at := int(min(max(offset-1, 0), int64(len(data))))
	before := data[:at]
	line = bytes.Count(before, []byte("\n")) + 1
	col = at - (bytes.LastIndexByte(before, '\n') + 1) + 1
	return line, col
}

type decoder struct {
	dec *json.Decoder
	read
}

// decodeStruct decodes the object that starts with tok into struct v.
func (d *decoder) decodeStruct(tok json.Token, path string, v reflect.Value) error {
	s, err := schemaOf(v.Type())
	if err != nil {
		return err
	}
	return d.decodeObject(tok, path, func(key, keyPath string, tok json.Token) error {
		idx, ok := s.keys[key]
		if !ok {
			return errorAt(keyPath, "unknown key (known: %s)", joinKeys(s.order))
		}
		fv, sc := v, s
		var f *field
		for _, i := range idx {
			f = sc.byIndex(i)
			fv = fv.Field(i)
			if f.kind == kindInline {
				if sc, err = schemaOf(f.typ); err != nil {
					return err
				}
			}
		}
		d.present[keyPath] = true
		return d.decodeField(tok, keyPath, fv, f)
	})
}

func (s *schema) byIndex(i int) *field {
	for _, f := range s.fields {
		if f.index == i {
			return f
		}
	}
	panic("conf: no field " + strconv.Itoa(i))
}

func joinKeys(keys []string) string {
	var b bytes.Buffer
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(k)
	}
	return b.String()
}

// decodeObject decodes the object that starts with tok, calling member
// with each key, its path and the first token of its value, which member
// decodes. A key may appear once.
func (d *decoder) decodeObject(tok json.Token, path string, member func(key, keyPath string, tok json.Token) error) error {
	if tok != json.Delim('{') {
		return errorAt(path, "%s: want an object", describeToken(tok))
	}
	seen := map[string]bool{}
	for d.dec.More() {
		tok, err := d.dec.Token()
		if err != nil {
			return &Error{Path: path, Err: err}
		}
		key := tok.(string) // a key is a string in valid JSON
		keyPath := joinPath(path, key)
		if seen[key] {
			return errorAt(keyPath, "repeated key")
		}
		seen[key] = true
		if tok, err = d.dec.Token(); err != nil {
			return &Error{Path: keyPath, Err: err}
		}
		if err := member(key, keyPath, tok); err != nil {
			return err
		}
	}
	if _, err := d.dec.Token(); err != nil { // the closing brace
		return &Error{Path: path, Err: err}
	}
	return nil
}

// decodeField decodes the value that starts with tok into field f, v.
func (d *decoder) decodeField(tok json.Token, path string, v reflect.Value, f *field) error {
	if tok == nil {
		if f.kind == kindStructPtr {
			return errorAt(path, "null: leave the key out for none, or write {} for one with its defaults")
		}
		return errorAt(path, "null: leave the key out for the default")
	}
	switch f.kind {
	case kindDuration:
		dur, err := durationOf(tok)
		if err != nil {
			return &Error{Path: path, Err: err}
		}
		v.SetInt(int64(dur))
		d.checkWritten(f, path, v)
		return nil
	case kindInt:
		n, ok := tok.(json.Number)
		if !ok {
			return errorAt(path, "%s: want a whole number", describeToken(tok))
		}
		i, err := strconv.ParseInt(string(n), 10, 64)
		if err != nil {
			// 1e3 and 3.0 are whole numbers too.
			x, ferr := strconv.ParseFloat(string(n), 64)
			if ferr != nil || x != math.Trunc(x) || x < math.MinInt64 || x >= math.MaxInt64 {
				return errorAt(path, "%s: want a whole number that fits an int", n)
			}
			i = int64(x)
		}
		if v.OverflowInt(i) {
			return errorAt(path, "%s: want a whole number that fits an int", n)
		}
		v.SetInt(i)
		d.checkWritten(f, path, v)
		return nil
	case kindFloat:
		n, ok := tok.(json.Number)
		if !ok {
			return errorAt(path, "%s: want a number", describeToken(tok))
		}
		x, err := strconv.ParseFloat(string(n), 64)
		if err != nil {
			return errorAt(path, "%s: want a number that fits a float64", n)
		}
		v.SetFloat(x)
		d.checkWritten(f, path, v)
		return nil
	case kindBool:
		b, ok := tok.(bool)
		if !ok {
			return errorAt(path, "%s: want true or false", describeToken(tok))
		}
		v.SetBool(b)
		return nil
	case kindString:
		s, ok := tok.(string)
		if !ok {
			return errorAt(path, "%s: want a string", describeToken(tok))
		}
		v.SetString(s)
		return nil
	case kindEnum:
		s, ok := tok.(string)
		if !ok {
			return errorAt(path, "%s: want a string", describeToken(tok))
		}
		for i, name := range f.enum {
			if s == name {
				if v.CanInt() {
					v.SetInt(int64(i))
				} else {
					v.SetUint(uint64(i))
				}
				return nil
			}
		}
		return errorAt(path, "%q: want %s", s, quoteList(f.enum))
	case kindStructPtr:
		elem := reflect.New(f.typ.Elem())
		if err := d.decodeStruct(tok, path, elem.Elem()); err != nil {
			return err
		}
		v.Set(elem)
		return nil
	case kindMap:
		m := reflect.MakeMap(f.typ)
		err := d.decodeObject(tok, path, func(key, keyPath string, tok json.Token) error {
			elem := reflect.New(f.typ.Elem()).Elem()
			if err := d.decodeElem(tok, keyPath, elem); err != nil {
				return err
			}
			d.present[keyPath] = true
			m.SetMapIndex(reflect.ValueOf(key).Convert(f.typ.Key()), elem)
			return nil
		})
		if err != nil {
			return err
		}
		if m.Len() > 0 { // {} is the same as no key
			v.Set(m)
		}
		return nil
	case kindSlice:
		return d.decodeElem(tok, path, v)
	}
	panic("conf: no decoding for " + f.typ.String())
}

// decodeElem decodes an element of a map or a list.
func (d *decoder) decodeElem(tok json.Token, path string, v reflect.Value) error {
	if tok == nil {
		return errorAt(path, "null: want a value")
	}
	switch v.Kind() {
	case reflect.Struct:
		return d.decodeStruct(tok, path, v)
	case reflect.String:
		s, ok := tok.(string)
		if !ok {
			return errorAt(path, "%s: want a string", describeToken(tok))
		}
		v.SetString(s)
		return nil
	case reflect.Slice:
		if tok != json.Delim('[') {
			return errorAt(path, "%s: want a list", describeToken(tok))
		}
		list := reflect.MakeSlice(v.Type(), 0, 0)
		for i := 0; d.dec.More(); i++ {
			tok, err := d.dec.Token()
			if err != nil {
				return &Error{Path: path, Err: err}
			}
			elem := reflect.New(v.Type().Elem()).Elem()
			if err := d.decodeElem(tok, fmt.Sprintf("%s[%d]", path, i), elem); err != nil {
				return err
			}
			list = reflect.Append(list, elem)
		}
		if _, err := d.dec.Token(); err != nil { // the closing bracket
			return &Error{Path: path, Err: err}
		}
		v.Set(list)
		return nil
	}
	panic("conf: no decoding for " + v.Type().String())
}

// checkWritten checks a number as a file wrote it, v: a 0 is None in a
// field that takes it, stays 0 where 0 means something, and is an error
// where the field has a default; -1, None in Go, is no value in a file.
func (d *decoder) checkWritten(f *field, path string, v reflect.Value) {
	if err := f.checkWritten(path, v); err != nil {
		d.bad[path] = err
		v.SetZero() // so that fill reaches the error, and no other of v
	}
}

func (f *field) checkWritten(path string, v reflect.Value) error {
	shown := render(v.Interface())
	if why, hint := f.written(v); why != "" {
		if hint {
			why += f.absentMeans("key")
		}
		return &Error{Path: path, Err: fmt.Errorf("%s: %s", shown, why)}
	}
	return nil
}

// written checks a number v as a file or a flag wrote it, and sets a 0 to
// None in a field that takes it. For a value that cannot be used it
// returns what it must be, and whether to add what leaving it out means
// (not for a value above a max).
func (f *field) written(v reflect.Value) (why string, hint bool) {
	x := number(v)
	switch {
	case x == 0 && f.none != "":
		if v.Kind() == reflect.Float64 {
			v.SetFloat(None)
		} else {
			v.SetInt(None)
		}
		return "", false
	case x == 0 && f.zeroIsWrong():
		return f.below(), true
	case x == 0:
		return "", false
	case x == None && f.none != "":
		return f.below(), true
	}
	if why := f.outside(v); why != "" {
		return why, why != f.above() || f.interval
	}
	return "", false
}

// durationOf reads a duration from a JSON token: a string that
// time.ParseDuration reads, or the number 0.
func durationOf(tok json.Token) (time.Duration, error) {
	switch t := tok.(type) {
	case string:
		d, err := time.ParseDuration(t)
		if err != nil {
			return 0, fmt.Errorf("%q: %w", t, err)
		}
		return d, nil
	case json.Number:
		if f, err := strconv.ParseFloat(string(t), 64); err == nil && f == 0 {
			return 0, nil
		}
	}
	return 0, fmt.Errorf(`%s: want a duration with its unit, such as "30s" or "1m30s"`, describeToken(tok))
}

// describeToken writes a JSON token for an error message.
func describeToken(tok json.Token) string {
	switch t := tok.(type) {
	case json.Delim:
		if t == '{' {
			return "an object"
		}
		return "a list"
	case string:
		return strconv.Quote(t)
	case json.Number:
		return t.String()
	case bool:
		return strconv.FormatBool(t)
	case nil:
		return "null"
	}
	return fmt.Sprint(tok)
}
