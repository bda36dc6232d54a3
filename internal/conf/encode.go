package conf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"time"
)

// MarshalJSON writes the struct v as a file holds it, its keys in
// declaration order: a zero field is left out (its default), None is
// written 0, a nil sub-struct is left out and a sub-struct with no field
// set is {}. [DecodeJSON] reads it back into v.
func MarshalJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Pointer {
		rv = rv.Elem()
	}
	if err := encodeStruct(&b, rv); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func encodeStruct(b *bytes.Buffer, v reflect.Value) error {
	b.WriteByte('{')
	n := 0
	if err := encodeFields(b, v, &n); err != nil {
		return err
	}
	b.WriteByte('}')
	return nil
}

func encodeFields(b *bytes.Buffer, v reflect.Value, n *int) error {
	s, err := schemaOf(v.Type())
	if err != nil {
		return err
	}
	for _, f := range s.fields {
		fv := v.Field(f.index)
		if f.kind == kindInline {
			if err := encodeFields(b, fv, n); err != nil {
				return err
			}
			continue
		}
		if f.kind == kindSkip || omit(f, fv) {
			continue
		}
		if *n > 0 {
			b.WriteByte(',')
		}
		*n++
		writeString(b, f.key)
		b.WriteByte(':')
		if err := encodeValue(b, f, fv); err != nil {
			return fmt.Errorf("%s: %w", f.key, err)
		}
	}
	return nil
}

// omit reports whether field f, v, is left out of a file.
func omit(f *field, v reflect.Value) bool {
	switch f.kind {
	case kindStructPtr:
		return v.IsNil()
	case kindMap, kindSlice:
		return v.Len() == 0
	case kindInt, kindFloat, kindDuration:
		return number(v) == 0
	}
	return v.IsZero()
}

func encodeValue(b *bytes.Buffer, f *field, v reflect.Value) error {
	switch f.kind {
	case kindInt, kindFloat, kindDuration:
		if f.none != "" && number(v) == None {
			v = reflect.New(v.Type()).Elem()
		}
		switch f.kind {
		case kindDuration:
			writeString(b, time.Duration(v.Int()).String())
		case kindInt:
			b.WriteString(strconv.FormatInt(v.Int(), 10))
		default:
			x := v.Float()
			if math.IsNaN(x) || math.IsInf(x, 0) {
				return fmt.Errorf("%v: a file holds finite numbers only", x)
			}
			b.WriteString(strconv.FormatFloat(x, 'g', -1, 64))
		}
	case kindBool:
		b.WriteString(strconv.FormatBool(v.Bool()))
	case kindString:
		writeString(b, v.String())
	case kindEnum:
		var i uint64
		if v.CanInt() {
			i = uint64(v.Int())
		} else {
			i = v.Uint()
		}
		if i >= uint64(len(f.enum)) {
			return fmt.Errorf("%d: want %s", i, orList(f.goEnm))
		}
		writeString(b, f.enum[i])
	case kindStructPtr:
		return encodeStruct(b, v.Elem())
	case kindMap, kindSlice:
		return encodeElem(b, v)
	}
	return nil
}

// encodeElem writes a map, a list, or an element of either.
func encodeElem(b *bytes.Buffer, v reflect.Value) error {
	switch v.Kind() {
	case reflect.Struct:
		return encodeStruct(b, v)
	case reflect.String:
		writeString(b, v.String())
	case reflect.Slice:
		b.WriteByte('[')
		for i := range v.Len() {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := encodeElem(b, v.Index(i)); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case reflect.Map:
		b.WriteByte('{')
		for i, k := range sortedKeys(v) {
			if i > 0 {
				b.WriteByte(',')
			}
			writeString(b, k)
			b.WriteByte(':')
			if err := encodeElem(b, v.MapIndex(reflect.ValueOf(k).Convert(v.Type().Key()))); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	}
	return nil
}

func writeString(b *bytes.Buffer, s string) {
	j, _ := json.Marshal(s)
	b.Write(j)
}
