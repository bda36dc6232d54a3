package damper

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	yamlv2 "go.yaml.in/yaml/v2"
	"sigs.k8s.io/yaml"
)

// PolicyConfig is a [Policy] as a configuration file writes it, in JSON or
// YAML, with snake_case keys:
//
//	max_attempts: 3
//	per_attempt_timeout: 45s
//	retry_budget_ratio: 0      # explicitly zero: the budget never grows
//	retry_budget_min_tokens: 20
//	on_budget_exhausted: passthrough
//	breaker:
//	  failure_ratio: 0.5
//	  open_for: 2s
//	  max_open_for: 10s
//	throttle: {}               # a throttle with its defaults
//	rate_limit:
//	  max_wait: 10s
//	  priority: batch
//	  limits:
//	    claude-sonnet-4: {requests_per_minute: 4000}
//
// Each field is the Policy field of its name, nil when its key is absent.
// A key that is absent means the default, as a zero field of Policy does;
// an absent breaker, throttle or rate_limit means none, and {} one with
// its defaults. A value written 0 means zero: in the fields that take
// [None] (retry_budget_ratio, retry_budget_min_tokens, backoff_base and
// max_retry_after) it becomes None, in the fields where 0 already means
// something (max_retry_cost_usd and stream_idle_timeout: off; the limits:
// learned) it is 0, and in the others, where zero cannot be used, it is an
// error. Durations are strings that [time.ParseDuration] reads ("30s",
// "1m30s"; the number 0 is zero too); on_budget_exhausted is "raise" or
// "passthrough", priority "interactive" or "batch". null is not a value:
// leave the key out.
//
// A file cannot hold the Classifier, the PriceTable or the breaker's
// OnStateChange, which are code: set them on the Policy that
// [PolicyConfig.Policy] returns. (A price table file may come later.)
//
// Decoding is strict: an unknown or repeated key, a value of the wrong
// type and a bad duration or name are errors, and so is, in
// [PolicyConfig.Policy], a value the Policy cannot use; each is a
// [*ConfigError] naming the key's path, such as "breaker.open_for". Like
// encoding/json, [PolicyConfig.UnmarshalJSON] sets only the keys the
// document has, so a file can override a PolicyConfig filled in from code
// (say from NewPolicyConfig(RecommendedPolicy())); on an error it changes
// nothing.
//
// A larger configuration file embeds a PolicyConfig as one of its fields:
// encoding/json calls its UnmarshalJSON, and so does sigs.k8s.io/yaml,
// which converts YAML to JSON first. A ConfigError's Path is then relative
// to the PolicyConfig; the embedding code may prefix it.
//
// [json.Marshal] of a PolicyConfig writes JSON, and yaml.Marshal of
// sigs.k8s.io/yaml writes YAML, that [ParsePolicyJSON] and
// [ParsePolicyYAML] read back into the same Policy.
type PolicyConfig struct {
	MaxAttempts          *int             `json:"max_attempts,omitempty"`
	PerAttemptTimeout    *Duration        `json:"per_attempt_timeout,omitempty"`
	MaxRetryCostUSD      *float64         `json:"max_retry_cost_usd,omitempty"`
	RetryBudgetRatio     *float64         `json:"retry_budget_ratio,omitempty"`
	RetryBudgetWindow    *Duration        `json:"retry_budget_window,omitempty"`
	RetryBudgetMinTokens *int             `json:"retry_budget_min_tokens,omitempty"`
	BackoffBase          *Duration        `json:"backoff_base,omitempty"`
	BackoffMax           *Duration        `json:"backoff_max,omitempty"`
	IgnoreRetryAfter     *bool            `json:"ignore_retry_after,omitempty"`
	MaxRetryAfter        *Duration        `json:"max_retry_after,omitempty"`
	OnBudgetExhausted    *string          `json:"on_budget_exhausted,omitempty"` // "raise" or "passthrough"
	MaxHoldBack          *int             `json:"max_hold_back,omitempty"`
	MaxEventBytes        *int             `json:"max_event_bytes,omitempty"`
	StreamIdleTimeout    *Duration        `json:"stream_idle_timeout,omitempty"`
	Breaker              *BreakerConfig   `json:"breaker,omitempty"`
	Throttle             *ThrottleConfig  `json:"throttle,omitempty"`
	RateLimit            *RateLimitConfig `json:"rate_limit,omitempty"`
	Hedge                *HedgeConfig     `json:"hedge,omitempty"`
	Fallback             *FallbackConfig  `json:"fallback,omitempty"`
}

// FallbackConfig is a [FallbackPolicy] in a [PolicyConfig]. The backends
// themselves are code (the SDK's options): see [WithBackends].
type FallbackConfig struct {
	OnSpendLimit *bool `json:"on_spend_limit,omitempty"`
	// Models lists each model's siblings, in order.
	Models map[string][]string `json:"models,omitempty"`
}

// BreakerConfig is a [BreakerPolicy] in a [PolicyConfig].
type BreakerConfig struct {
	FailureRatio *float64  `json:"failure_ratio,omitempty"`
	MinAttempts  *int      `json:"min_attempts,omitempty"`
	Window       *Duration `json:"window,omitempty"`
	OpenFor      *Duration `json:"open_for,omitempty"`
	MaxOpenFor   *Duration `json:"max_open_for,omitempty"`
}

// ThrottleConfig is a [ThrottlePolicy] in a [PolicyConfig].
type ThrottleConfig struct {
	MaxTokens  *int     `json:"max_tokens,omitempty"`
	TokenRatio *float64 `json:"token_ratio,omitempty"`
}

// RateLimitConfig is a [RateLimitPolicy] in a [PolicyConfig].
type RateLimitConfig struct {
	// Limits is keyed by model ID or limit group, each key applying to its
	// group, as [LimitGroup] names them (see [RateLimitPolicy.Limits]).
	Limits     map[string]RateLimitsConfig `json:"limits,omitempty"`
	MaxWait    *Duration                   `json:"max_wait,omitempty"`
	Priority   *string                     `json:"priority,omitempty"` // "interactive" or "batch"
	BatchShare *float64                    `json:"batch_share,omitempty"`
}

// HedgeConfig is a [HedgePolicy] in a [PolicyConfig].
type HedgeConfig struct {
	Delay         *Duration `json:"delay,omitempty"`
	Quantile      *float64  `json:"quantile,omitempty"`
	MinDelay      *Duration `json:"min_delay,omitempty"`
	Window        *int      `json:"window,omitempty"`
	MinSamples    *int      `json:"min_samples,omitempty"`
	OnlyWhenAsked *bool     `json:"only_when_asked,omitempty"`
}

// RateLimitsConfig is the [RateLimits] of one limit group in a
// [RateLimitConfig]; an absent key, or 0, means learned.
type RateLimitsConfig struct {
	RequestsPerMinute     *int `json:"requests_per_minute,omitempty"`
	InputTokensPerMinute  *int `json:"input_tokens_per_minute,omitempty"`
	OutputTokensPerMinute *int `json:"output_tokens_per_minute,omitempty"`
}

// Duration is a [time.Duration] in a configuration file: a string that
// [time.ParseDuration] reads, such as "30s" or "1m30s", or the number 0.
type Duration time.Duration

// String returns the duration as [time.Duration.String] writes it.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes the duration as a string, such as "1m30s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a string such as "1m30s", or the number 0; null,
// as encoding/json has it, changes nothing.
func (d *Duration) UnmarshalJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil || tok == nil {
		return err
	}
	v, err := durationOf(tok)
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// durationOf reads a duration from a JSON token.
func durationOf(tok json.Token) (Duration, error) {
	switch t := tok.(type) {
	case string:
		d, err := time.ParseDuration(t)
		if err != nil {
			return 0, fmt.Errorf("%q: %w", t, err)
		}
		return Duration(d), nil
	case json.Number:
		if f, err := strconv.ParseFloat(string(t), 64); err == nil && f == 0 {
			return 0, nil
		}
	}
	return 0, fmt.Errorf(`%s: want a duration with its unit, such as "30s" or "1m30s"`, describeToken(tok))
}

// ConfigError is a configuration that cannot be loaded: a document that
// is not JSON or YAML, or a key or value of a [PolicyConfig] that is wrong.
type ConfigError struct {
	// File is the file read, when [LoadPolicyFile] read one.
	File string
	// Path is the key's path from the PolicyConfig, its parts joined with
	// dots: "max_attempts", "breaker.open_for",
	// "rate_limit.limits.claude-sonnet-4.requests_per_minute". It is empty
	// for an error of the whole document.
	Path string
	// Err says what is wrong, after the value as written when there is one.
	Err error
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString("damper: ")
	if e.File != "" {
		b.WriteString(e.File)
	} else {
		b.WriteString("policy config")
	}
	if e.Path != "" {
		b.WriteString(": ")
		b.WriteString(e.Path)
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *ConfigError) Unwrap() error { return e.Err }

func configError(path string, format string, args ...any) *ConfigError {
	return &ConfigError{Path: path, Err: fmt.Errorf(format, args...)}
}

// ParsePolicyJSON returns the Policy of a JSON document (see
// [PolicyConfig]). null is the zero Policy.
func ParsePolicyJSON(data []byte) (Policy, error) {
	var c PolicyConfig
	if err := json.Unmarshal(data, &c); err != nil {
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) {
			line, col := lineColumn(data, syntax.Offset)
			return Policy{}, &ConfigError{Err: fmt.Errorf("line %d, column %d: %w", line, col, err)}
		}
		var ce *ConfigError
		if errors.As(err, &ce) {
			return Policy{}, ce
		}
		return Policy{}, &ConfigError{Err: err}
	}
	return c.Policy()
}

// ParsePolicyYAML returns the Policy of a YAML document (see
// [PolicyConfig]); it reads JSON too, except JSON indented with tabs,
// which YAML does not allow. An empty document is the zero Policy. YAML
// 1.1 reads an unquoted yes, no, on or off as a boolean.
func ParsePolicyYAML(data []byte) (Policy, error) {
	// The conversion to JSON finds a repeated key but not its path, and
	// merges two keys that only YAML tells apart, such as 1 and "1": look
	// for both first, in a decoding that keeps every key in order.
	var doc yamlv2.MapSlice
	if yamlv2.Unmarshal(data, &doc) == nil {
		if path, ok := repeatedKey(doc, ""); ok {
			return Policy{}, configError(path, "repeated key")
		}
	}
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		var unsupported *json.UnsupportedValueError
		if errors.As(err, &unsupported) { // .nan, .inf
			err = fmt.Errorf("%s: no key takes a value that is not a finite number", unsupported.Str)
		}
		return Policy{}, &ConfigError{Err: err}
	}
	return ParsePolicyJSON(j)
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

// LoadPolicyFile returns the Policy of the file name: JSON when its name
// ends in .json, YAML otherwise. An error in the file is a [*ConfigError]
// whose File is name.
func LoadPolicyFile(name string) (Policy, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return Policy{}, fmt.Errorf("damper: %w", err)
	}
	var p Policy
	if strings.EqualFold(filepath.Ext(name), ".json") {
		p, err = ParsePolicyJSON(data)
	} else {
		p, err = ParsePolicyYAML(data)
	}
	if ce, ok := err.(*ConfigError); ok {
		withFile := *ce
		withFile.File = name
		return Policy{}, &withFile
	}
	return p, err
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

// UnmarshalJSON decodes a JSON object into c strictly (see [PolicyConfig]):
// it sets the keys the object has and leaves the others; null changes
// nothing. On an error, a [*ConfigError], c is unchanged.
func (c *PolicyConfig) UnmarshalJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return &ConfigError{Err: err}
	}
	if tok == nil {
		return nil
	}
	next := *c
	if err := decodeConfig(dec, tok, "", reflect.ValueOf(&next).Elem()); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return configError("", "more data after the document")
	}
	*c = next
	return nil
}

var durationType = reflect.TypeFor[Duration]()

// decodeConfig decodes into v the value that starts with tok, following
// the json tags of the config types. It never writes through a pointer
// that v holds: it sets v to a new one, so that a copy of the config being
// decoded is left as it was.
func decodeConfig(dec *json.Decoder, tok json.Token, path string, v reflect.Value) error {
	t := v.Type()
	if tok == nil {
		if t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct {
			return configError(path, "null: leave the key out for none, or write {} for one with its defaults")
		}
		return configError(path, "null: leave the key out for the default")
	}
	if t == durationType {
		d, err := durationOf(tok)
		if err != nil {
			return &ConfigError{Path: path, Err: err}
		}
		v.SetInt(int64(d))
		return nil
	}
	switch t.Kind() {
	case reflect.Pointer:
		elem := reflect.New(t.Elem())
		if !v.IsNil() {
			elem.Elem().Set(v.Elem()) // merge into a copy
		}
		if err := decodeConfig(dec, tok, path, elem.Elem()); err != nil {
			return err
		}
		v.Set(elem)
		return nil
	case reflect.Int:
		n, ok := tok.(json.Number)
		if !ok {
			return configError(path, "%s: want a whole number", describeToken(tok))
		}
		i, err := strconv.ParseInt(string(n), 10, 0)
		if err != nil {
			// 1e3 and 3.0 are whole numbers too.
			f, ferr := strconv.ParseFloat(string(n), 64)
			if ferr != nil || f != math.Trunc(f) || f < math.MinInt || f >= math.MaxInt {
				return configError(path, "%s: want a whole number that fits an int", n)
			}
			i = int64(f)
		}
		v.SetInt(i)
		return nil
	case reflect.Float64:
		n, ok := tok.(json.Number)
		if !ok {
			return configError(path, "%s: want a number", describeToken(tok))
		}
		f, err := strconv.ParseFloat(string(n), 64)
		if err != nil {
			return configError(path, "%s: want a number that fits a float64", n)
		}
		v.SetFloat(f)
		return nil
	case reflect.Bool:
		b, ok := tok.(bool)
		if !ok {
			return configError(path, "%s: want true or false", describeToken(tok))
		}
		v.SetBool(b)
		return nil
	case reflect.String:
		s, ok := tok.(string)
		if !ok {
			return configError(path, "%s: want a string", describeToken(tok))
		}
		v.SetString(s)
		return nil
	case reflect.Struct:
		fields := configFields(t)
		return decodeObject(dec, tok, path, func(key, keyPath string, tok json.Token) error {
			i, ok := fields[key]
			if !ok {
				return configError(keyPath, "unknown key (known: %s)", strings.Join(configKeys(t), ", "))
			}
			return decodeConfig(dec, tok, keyPath, v.Field(i))
		})
	case reflect.Map: // a key's value replaces the one the map had
		m := reflect.MakeMap(t)
		for iter := v.MapRange(); iter.Next(); {
			m.SetMapIndex(iter.Key(), iter.Value())
		}
		err := decodeObject(dec, tok, path, func(key, keyPath string, tok json.Token) error {
			elem := reflect.New(t.Elem()).Elem()
			if err := decodeConfig(dec, tok, keyPath, elem); err != nil {
				return err
			}
			m.SetMapIndex(reflect.ValueOf(key), elem)
			return nil
		})
		if err != nil {
			return err
		}
		v.Set(m)
		return nil
	case reflect.Slice: // a list replaces the one the config had
		if tok != json.Delim('[') {
			return configError(path, "%s: want a list", describeToken(tok))
		}
		list := reflect.MakeSlice(t, 0, 0)
		for i := 0; dec.More(); i++ {
			tok, err := dec.Token()
			if err != nil {
				return &ConfigError{Path: path, Err: err}
			}
			elem := reflect.New(t.Elem()).Elem()
			if err := decodeConfig(dec, tok, fmt.Sprintf("%s[%d]", path, i), elem); err != nil {
				return err
			}
			list = reflect.Append(list, elem)
		}
		if _, err := dec.Token(); err != nil { // the closing bracket
			return &ConfigError{Path: path, Err: err}
		}
		v.Set(list)
		return nil
	}
	panic("damper: no config decoding for " + t.String())
}

// decodeObject decodes the object that starts with tok, calling member
// with each key, its path and the first token of its value, which member
// decodes. A key may appear once.
func decodeObject(dec *json.Decoder, tok json.Token, path string, member func(key, keyPath string, tok json.Token) error) error {
	if tok != json.Delim('{') {
		return configError(path, "%s: want an object", describeToken(tok))
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return &ConfigError{Path: path, Err: err}
		}
		key := tok.(string) // a key is a string in valid JSON
		keyPath := joinPath(path, key)
		if seen[key] {
			return configError(keyPath, "repeated key")
		}
		seen[key] = true
		if tok, err = dec.Token(); err != nil {
			return &ConfigError{Path: keyPath, Err: err}
		}
		if err := member(key, keyPath, tok); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return &ConfigError{Path: path, Err: err}
	}
	return nil
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// configFields maps the keys of a config struct to its fields.
func configFields(t reflect.Type) map[string]int {
	fields := make(map[string]int, t.NumField())
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		fields[name] = i
	}
	return fields
}

// configKeys returns the keys of a config struct, in order.
func configKeys(t reflect.Type) []string {
	keys := make([]string, t.NumField())
	for i := range keys {
		keys[i], _, _ = strings.Cut(t.Field(i).Tag.Get("json"), ",")
	}
	return keys
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

// zeroRule says what a value written 0 means in one key.
type zeroRule uint8

const (
	zeroIsNone  zeroRule = iota // the field takes None: 0 is None
	zeroIsZero                  // 0 already means something in the Policy
	zeroIsWrong                 // the field cannot be zero: an error
)

// configField is where a Policy field came from, to name it in an error.
type configField struct {
	path    string
	written string // the value in the file, as a config writes it; "" if absent
}

// converter fills in a Policy from a PolicyConfig, remembering the key
// and value of every field for the errors of withDefaults.
type converter struct {
	fields map[string]configField // by Go field path below Policy
}

// set stores the config value v (nil when absent) of a Policy field into
// dst. A 0 that the field cannot take, and a -1 (which in the Policy would
// be None), are stored as values withDefaults rejects, so that it names
// them with its reasons; the error then shows the value as written.
func set[T int | float64 | time.Duration](cv *converter, dst *T, v *T, field, path string, rule zeroRule, written func(T) string) {
	cv.fields[field] = configField{path: path}
	if v == nil {
		return
	}
	cv.fields[field] = configField{path: path, written: written(*v)}
	switch {
	case *v == 0 && rule == zeroIsNone:
		*dst = None
	case *v == 0 && rule == zeroIsWrong:
		*dst = None // taken by no field that cannot be zero
	case *v == None && rule == zeroIsNone:
		*dst = None - 1
	default:
		*dst = *v
	}
}

func (cv *converter) int(dst *int, v *int, field, path string, rule zeroRule) {
	set(cv, dst, v, field, path, rule, strconv.Itoa)
}

func (cv *converter) float(dst *float64, v *float64, field, path string, rule zeroRule) {
	set(cv, dst, v, field, path, rule, formatFloat)
}

func (cv *converter) duration(dst *time.Duration, v *Duration, field, path string, rule zeroRule) {
	set(cv, dst, (*time.Duration)(v), field, path, rule, quoteDuration)
}

func formatFloat(f float64) string         { return strconv.FormatFloat(f, 'g', -1, 64) }
func quoteDuration(d time.Duration) string { return strconv.Quote(d.String()) }

// Policy returns the Policy that c describes (see [PolicyConfig]), with
// the zero value in every field whose key is absent, as [New] expects. It
// checks the values as New does; its error is a [*ConfigError] naming the
// key of the first one that cannot be used.
func (c PolicyConfig) Policy() (Policy, error) {
	cv := converter{fields: map[string]configField{}}
	var p Policy
	cv.int(&p.MaxAttempts, c.MaxAttempts, "MaxAttempts", "max_attempts", zeroIsWrong)
	cv.duration(&p.PerAttemptTimeout, c.PerAttemptTimeout, "PerAttemptTimeout", "per_attempt_timeout", zeroIsWrong)
	cv.float(&p.MaxRetryCostUSD, c.MaxRetryCostUSD, "MaxRetryCostUSD", "max_retry_cost_usd", zeroIsZero)
	cv.float(&p.RetryBudgetRatio, c.RetryBudgetRatio, "RetryBudgetRatio", "retry_budget_ratio", zeroIsNone)
	cv.duration(&p.RetryBudgetWindow, c.RetryBudgetWindow, "RetryBudgetWindow", "retry_budget_window", zeroIsWrong)
	cv.int(&p.RetryBudgetMinTokens, c.RetryBudgetMinTokens, "RetryBudgetMinTokens", "retry_budget_min_tokens", zeroIsNone)
	cv.duration(&p.BackoffBase, c.BackoffBase, "BackoffBase", "backoff_base", zeroIsNone)
	cv.duration(&p.BackoffMax, c.BackoffMax, "BackoffMax", "backoff_max", zeroIsWrong)
	if c.IgnoreRetryAfter != nil {
		p.IgnoreRetryAfter = *c.IgnoreRetryAfter
	}
	cv.duration(&p.MaxRetryAfter, c.MaxRetryAfter, "MaxRetryAfter", "max_retry_after", zeroIsNone)
	if c.OnBudgetExhausted != nil {
		switch *c.OnBudgetExhausted {
		case "raise":
			p.OnBudgetExhausted = RaiseBudgetExhausted
		case "passthrough":
			p.OnBudgetExhausted = PassthroughBudgetExhausted
		default:
			return Policy{}, configError("on_budget_exhausted", `%q: want "raise" or "passthrough"`, *c.OnBudgetExhausted)
		}
	}
	cv.int(&p.MaxHoldBack, c.MaxHoldBack, "MaxHoldBack", "max_hold_back", zeroIsWrong)
	cv.int(&p.MaxEventBytes, c.MaxEventBytes, "MaxEventBytes", "max_event_bytes", zeroIsWrong)
	cv.duration(&p.StreamIdleTimeout, c.StreamIdleTimeout, "StreamIdleTimeout", "stream_idle_timeout", zeroIsZero)

	if b := c.Breaker; b != nil {
		p.Breaker = &BreakerPolicy{}
		cv.float(&p.Breaker.FailureRatio, b.FailureRatio, "Breaker.FailureRatio", "breaker.failure_ratio", zeroIsWrong)
		cv.int(&p.Breaker.MinAttempts, b.MinAttempts, "Breaker.MinAttempts", "breaker.min_attempts", zeroIsWrong)
		cv.duration(&p.Breaker.Window, b.Window, "Breaker.Window", "breaker.window", zeroIsWrong)
		cv.duration(&p.Breaker.OpenFor, b.OpenFor, "Breaker.OpenFor", "breaker.open_for", zeroIsWrong)
		cv.duration(&p.Breaker.MaxOpenFor, b.MaxOpenFor, "Breaker.MaxOpenFor", "breaker.max_open_for", zeroIsWrong)
	}
	if t := c.Throttle; t != nil {
		p.Throttle = &ThrottlePolicy{}
		cv.int(&p.Throttle.MaxTokens, t.MaxTokens, "Throttle.MaxTokens", "throttle.max_tokens", zeroIsWrong)
		cv.float(&p.Throttle.TokenRatio, t.TokenRatio, "Throttle.TokenRatio", "throttle.token_ratio", zeroIsWrong)
	}
	if r := c.RateLimit; r != nil {
		p.RateLimit = &RateLimitPolicy{}
		cv.duration(&p.RateLimit.MaxWait, r.MaxWait, "RateLimit.MaxWait", "rate_limit.max_wait", zeroIsNone)
		if r.Priority != nil {
			switch *r.Priority {
			case "interactive":
				p.RateLimit.Priority = Interactive
			case "batch":
				p.RateLimit.Priority = Batch
			default:
				return Policy{}, configError("rate_limit.priority", `%q: want "interactive" or "batch"`, *r.Priority)
			}
		}
		cv.float(&p.RateLimit.BatchShare, r.BatchShare, "RateLimit.BatchShare", "rate_limit.batch_share", zeroIsWrong)
		if len(r.Limits) > 0 {
			p.RateLimit.Limits = make(map[string]RateLimits, len(r.Limits))
			cv.fields["RateLimit.Limits"] = configField{path: "rate_limit.limits", written: `""`}
			for _, group := range slices.Sorted(maps.Keys(r.Limits)) {
				if !boundedName(group) {
					return Policy{}, configError("rate_limit.limits", "%s: a key is a model ID or a limit group's name, at most %d bytes of UTF-8", quoteKey(group), maxModelID)
				}
				l, in := r.Limits[group], RateLimits{}
				field, path := fmt.Sprintf("RateLimit.Limits[%q].", group), "rate_limit.limits."+group+"."
				cv.fields[strings.TrimSuffix(field, ".")] = configField{path: strings.TrimSuffix(path, "."), written: strconv.Quote(group)}
				cv.int(&in.RequestsPerMinute, l.RequestsPerMinute, field+"RequestsPerMinute", path+"requests_per_minute", zeroIsZero)
				cv.int(&in.InputTokensPerMinute, l.InputTokensPerMinute, field+"InputTokensPerMinute", path+"input_tokens_per_minute", zeroIsZero)
				cv.int(&in.OutputTokensPerMinute, l.OutputTokensPerMinute, field+"OutputTokensPerMinute", path+"output_tokens_per_minute", zeroIsZero)
				p.RateLimit.Limits[group] = in
			}
		}
	}

	if h := c.Hedge; h != nil {
		p.Hedge = &HedgePolicy{}
		cv.duration(&p.Hedge.Delay, h.Delay, "Hedge.Delay", "hedge.delay", zeroIsZero)
		cv.float(&p.Hedge.Quantile, h.Quantile, "Hedge.Quantile", "hedge.quantile", zeroIsWrong)
		cv.duration(&p.Hedge.MinDelay, h.MinDelay, "Hedge.MinDelay", "hedge.min_delay", zeroIsZero)
		cv.int(&p.Hedge.Window, h.Window, "Hedge.Window", "hedge.window", zeroIsWrong)
		cv.int(&p.Hedge.MinSamples, h.MinSamples, "Hedge.MinSamples", "hedge.min_samples", zeroIsWrong)
		if h.OnlyWhenAsked != nil {
			p.Hedge.OnlyWhenAsked = *h.OnlyWhenAsked
		}
	}

	if f := c.Fallback; f != nil {
		p.Fallback = &FallbackPolicy{}
		if f.OnSpendLimit != nil {
			p.Fallback.OnSpendLimit = *f.OnSpendLimit
		}
		if len(f.Models) > 0 {
			p.Fallback.Models = make(map[string][]string, len(f.Models))
			cv.fields["Fallback.Models"] = configField{path: "fallback.models", written: `""`}
			for model, siblings := range f.Models {
				written, _ := json.Marshal(siblings)
				if len(siblings) > maxFallbackSiblings { // counted, not written out
					written = fmt.Appendf(nil, "%d siblings", len(siblings))
				}
				cv.fields[fmt.Sprintf("Fallback.Models[%q]", model)] = configField{path: "fallback.models." + model, written: string(written)}
				p.Fallback.Models[model] = slices.Clone(siblings)
			}
		}
	}

	if _, err := p.withDefaults(); err != nil {
		return Policy{}, cv.translate(err)
	}
	return p, nil
}

// translate names, in an error of withDefaults, the key and the value as
// the file has them.
func (cv *converter) translate(err error) error {
	var fe *policyFieldError
	if !errors.As(err, &fe) {
		return &ConfigError{Err: err}
	}
	f, ok := cv.fields[fe.field]
	if !ok {
		return &ConfigError{Err: err}
	}
	written := f.written
	if written == "" { // a default, which another field's value made wrong
		switch v := fe.value.(type) {
		case time.Duration:
			written = quoteDuration(v) + " (the default)"
		default:
			written = fmt.Sprintf("%v (the default)", v)
		}
	}
	why := strings.NewReplacer(
		"; None means 0)", ")",
		"(0 means the default, ", "(leave the key out for the default, ",
		"BackoffMax (", "backoff_max (",
		"than OpenFor (", "than open_for (",
		"exceed Window (", "exceed window (",
	).Replace(fe.why)
	return &ConfigError{Path: f.path, Err: fmt.Errorf("%s: %s", written, why)}
}

// NewPolicyConfig returns the configuration of p, which
// [PolicyConfig.Policy] turns back into p: a zero field is an absent key,
// [None] is 0. It leaves out what a file cannot hold: the Classifier, the
// PriceTable and the breaker's OnStateChange.
func NewPolicyConfig(p Policy) PolicyConfig {
	c := PolicyConfig{
		MaxAttempts:          configValue(p.MaxAttempts, false),
		PerAttemptTimeout:    configDuration(p.PerAttemptTimeout, false),
		MaxRetryCostUSD:      configValue(p.MaxRetryCostUSD, false),
		RetryBudgetRatio:     configValue(p.RetryBudgetRatio, true),
		RetryBudgetWindow:    configDuration(p.RetryBudgetWindow, false),
		RetryBudgetMinTokens: configValue(p.RetryBudgetMinTokens, true),
		BackoffBase:          configDuration(p.BackoffBase, true),
		BackoffMax:           configDuration(p.BackoffMax, false),
		MaxRetryAfter:        configDuration(p.MaxRetryAfter, true),
		MaxHoldBack:          configValue(p.MaxHoldBack, false),
		MaxEventBytes:        configValue(p.MaxEventBytes, false),
		StreamIdleTimeout:    configDuration(p.StreamIdleTimeout, false),
	}
	if p.IgnoreRetryAfter {
		c.IgnoreRetryAfter = &p.IgnoreRetryAfter
	}
	if p.OnBudgetExhausted != RaiseBudgetExhausted {
		s := p.OnBudgetExhausted.String()
		c.OnBudgetExhausted = &s
	}
	if b := p.Breaker; b != nil {
		c.Breaker = &BreakerConfig{
			FailureRatio: configValue(b.FailureRatio, false),
			MinAttempts:  configValue(b.MinAttempts, false),
			Window:       configDuration(b.Window, false),
			OpenFor:      configDuration(b.OpenFor, false),
			MaxOpenFor:   configDuration(b.MaxOpenFor, false),
		}
	}
	if t := p.Throttle; t != nil {
		c.Throttle = &ThrottleConfig{
			MaxTokens:  configValue(t.MaxTokens, false),
			TokenRatio: configValue(t.TokenRatio, false),
		}
	}
	if r := p.RateLimit; r != nil {
		c.RateLimit = &RateLimitConfig{
			MaxWait:    configDuration(r.MaxWait, true),
			BatchShare: configValue(r.BatchShare, false),
		}
		if r.Priority != Interactive {
			s := r.Priority.String()
			c.RateLimit.Priority = &s
		}
		if len(r.Limits) > 0 {
			c.RateLimit.Limits = make(map[string]RateLimitsConfig, len(r.Limits))
			for group, l := range r.Limits {
				c.RateLimit.Limits[group] = RateLimitsConfig{
					RequestsPerMinute:     configValue(l.RequestsPerMinute, false),
					InputTokensPerMinute:  configValue(l.InputTokensPerMinute, false),
					OutputTokensPerMinute: configValue(l.OutputTokensPerMinute, false),
				}
			}
		}
	}
	if h := p.Hedge; h != nil {
		c.Hedge = &HedgeConfig{
			Delay:      configDuration(h.Delay, false),
			Quantile:   configValue(h.Quantile, false),
			MinDelay:   configDuration(h.MinDelay, false),
			Window:     configValue(h.Window, false),
			MinSamples: configValue(h.MinSamples, false),
		}
		if h.OnlyWhenAsked {
			c.Hedge.OnlyWhenAsked = &h.OnlyWhenAsked
		}
	}
	if f := p.Fallback; f != nil {
		c.Fallback = &FallbackConfig{}
		if f.OnSpendLimit {
			c.Fallback.OnSpendLimit = &f.OnSpendLimit
		}
		for model, siblings := range f.Models {
			if c.Fallback.Models == nil {
				c.Fallback.Models = make(map[string][]string, len(f.Models))
			}
			c.Fallback.Models[model] = slices.Clone(siblings)
		}
	}
	return c
}

// configValue is the config value of a Policy field: absent for 0, and
// for None, in a field that takes it, 0.
func configValue[T int | float64 | time.Duration](v T, takesNone bool) *T {
	switch {
	case v == 0:
		return nil
	case v == None && takesNone:
		v = 0
	}
	return &v
}

func configDuration(d time.Duration, takesNone bool) *Duration {
	return (*Duration)(configValue(d, takesNone))
}
