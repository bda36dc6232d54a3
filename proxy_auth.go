package damper

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/damper-ai/damper-go/internal/engine"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/damper-ai/damper-go/internal/conf"
)

// Client authentication at the proxy: the tenants a Proxy serves, each
// named by the SHA-256 hashes of its client keys, and the check every
// request passes before anything is sent with the operator's credentials.

// Bounds of the tenants a Proxy takes.
const (
	// maxTenants bounds ProxyConfig.Tenants.
	maxTenants = 1000
	// maxTenantKeys bounds the keys of one tenant: enough to rotate
	// (the new key added, clients moved, the old one removed).
	maxTenantKeys = 16
	// maxTenantName bounds a tenant's name, which becomes a log field.
	maxTenantName = 64
	// maxClientKeyBytes bounds a key a client presents: a longer one is
	// refused before it is hashed.
	maxClientKeyBytes = 256
)

func init() { conf.Register(checkTenant) }

// checkTenant checks a tenant's name and the form of its hashes; that it
// has a key at all is checked where its keys are all known (NewProxy, and
// the command, which adds key_env's).
func checkTenant(t *Tenant, _ Tenant) error {
	if err := checkTenantName(t.Name); err != nil {
		return err
	}
	for i, h := range t.KeySHA256 {
		if _, err := parseKeyHash(h); err != nil {
			return &conf.FieldError{Field: "KeySHA256", Value: conf.Text(excerpt([]byte(h))), Why: fmt.Sprintf("entry %d: %v", i, err)}
		}
	}
	return nil
}

func checkTenantName(name string) error {
	ok := name != "" && len(name) <= maxTenantName
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.'
	}
	if !ok {
		return &conf.FieldError{Field: "Name", Value: conf.Text(excerpt([]byte(name))),
			Why: fmt.Sprintf("want 1 to %d ASCII letters, digits, '-', '_' or '.'", maxTenantName)}
	}
	return nil
}

// parseKeyHash reads a key's hash: 64 hexadecimal digits, either case.
func parseKeyHash(h string) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	if len(h) != 2*sha256.Size {
		return sum, fmt.Errorf("want the key's SHA-256: 64 hexadecimal digits, not %d characters (damper key makes a key and its hash)", len(h))
	}
	if _, err := hex.Decode(sum[:], []byte(h)); err != nil {
		return sum, errors.New("want the key's SHA-256: 64 hexadecimal digits (damper key makes a key and its hash)")
	}
	return sum, nil
}

// ClientKeyHash is the hash of a client key as [Tenant].KeySHA256 holds
// it: its SHA-256, in lowercase hexadecimal. A client key has at most 256
// bytes: a Proxy refuses a longer one before it hashes it.
func ClientKeyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// clientKeys are the keys of a Proxy's tenants: every hash, with the
// tenant it names.
type clientKeys struct {
	hashes  [][sha256.Size]byte
	owner   []int32  // owner[i] is the index in tenants of hashes[i]'s tenant
	tenants []Tenant // filled in
}

// newClientKeys checks tenants and reads their hashes.
func newClientKeys(tenants []Tenant) (*clientKeys, error) {
	if len(tenants) > maxTenants {
		return nil, fmt.Errorf("damper: ProxyConfig.Tenants: %d tenants: at most %d", len(tenants), maxTenants)
	}
	k := &clientKeys{}
	byName := map[string]int{}
	byHash := map[[sha256.Size]byte]int{}
	for i, t := range tenants {
		field := fmt.Sprintf("damper: ProxyConfig.Tenants[%d] (%s)", i, excerpt([]byte(t.Name)))
		if err := conf.Fill(&t); err != nil { // checkTenant, the bounds and the defaults
			return nil, fmt.Errorf("%s.%w", field, err)
		}
		if j, ok := byName[t.Name]; ok {
			return nil, fmt.Errorf("%s.Name: Tenants[%d] has this name already", field, j)
		}
		byName[t.Name] = i
		switch {
		case len(t.KeySHA256) == 0:
			return nil, fmt.Errorf("%s.KeySHA256: empty: a tenant needs a key", field)
		case len(t.KeySHA256) > maxTenantKeys:
			return nil, fmt.Errorf("%s.KeySHA256: %d keys: at most %d", field, len(t.KeySHA256), maxTenantKeys)
		}
		for _, h := range t.KeySHA256 {
			sum, _ := parseKeyHash(h) // checked by checkTenant
			if j, ok := byHash[sum]; ok {
				return nil, fmt.Errorf("%s.KeySHA256: a key of Tenants[%d] (%s) has this hash already: a key names one tenant", field, j, tenants[j].Name)
			}
			byHash[sum] = i
			k.hashes = append(k.hashes, sum)
			k.owner = append(k.owner, int32(len(k.tenants)))
		}
		k.tenants = append(k.tenants, t)
	}
	return k, nil
}

// match returns the index of the tenant whose key's hash is sum, or -1,
// and the number of hashes compared: every one, whichever matches, each in
// constant time, so that the time taken tells nothing of which hash, if
// any, is near the key.
func (k *clientKeys) match(sum [sha256.Size]byte) (tenant, compared int) {
	found := -1
	for i := range k.hashes {
		eq := subtle.ConstantTimeCompare(sum[:], k.hashes[i][:])
		found = subtle.ConstantTimeSelect(eq, int(k.owner[i]), found)
		compared++
	}
	return found, compared
}

// authenticate returns the index of the tenant whose key h presents, or
// an error that says what is wrong, for the client, never showing the key.
func (k *clientKeys) authenticate(h http.Header) (int, error) {
	key, err := presentedKey(h)
	if err != nil {
		return -1, err
	}
	t, _ := k.match(sha256.Sum256([]byte(key)))
	if t < 0 {
		return -1, errors.New("damper proxy: invalid x-api-key: the key names no tenant of this proxy")
	}
	return t, nil
}

// presentedKey is the key a client presents in h: x-api-key, or a bearer
// token in Authorization (the SDKs' apiKey and authToken). Both may come,
// holding the same key. Its errors never show the key.
func presentedKey(h http.Header) (string, error) {
	apiKeys, auths := h.Values("X-Api-Key"), h.Values("Authorization")
	if len(apiKeys) > 1 || len(auths) > 1 {
		return "", errors.New("damper proxy: x-api-key or authorization is repeated: send one key")
	}
	var key, bearer string
	if len(apiKeys) == 1 {
		key = apiKeys[0]
		if key == "" {
			return "", errors.New("damper proxy: x-api-key is empty: send this proxy's client key")
		}
	}
	if len(auths) == 1 {
		scheme, token, ok := strings.Cut(auths[0], " ")
		token = strings.TrimLeft(token, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
			return "", errors.New("damper proxy: authorization: want \"Bearer\" and this proxy's client key")
		}
		bearer = token
	}
	switch {
	case key == "" && bearer == "":
		return "", errors.New("damper proxy: no x-api-key: send this proxy's client key as x-api-key or as a bearer token")
	case key != "" && bearer != "" && subtle.ConstantTimeCompare([]byte(key), []byte(bearer)) != 1:
		return "", errors.New("damper proxy: x-api-key and authorization hold different keys: send one key")
	case key == "":
		key = bearer
	}
	if len(key) > maxClientKeyBytes {
		return "", fmt.Errorf("damper proxy: invalid x-api-key: a client key has at most %d bytes", maxClientKeyBytes)
	}
	return key, nil
}

// forwardedClientHeaders are the headers of a client's request that reach
// a backend spending the operator's credentials, besides the SDKs'
// X-Stainless-* metadata: what the API reads of a request's form. The
// platforms' clients translate them (Bedrock and Vertex take
// anthropic-version, and Bedrock anthropic-beta, into the body).
var forwardedClientHeaders = []string{"Anthropic-Version", "Anthropic-Beta", "Content-Type", "Accept", "User-Agent"}

// operatorHeader is the header of a request sent with the operator's
// credentials, from in, the client's (less its connection's headers): the
// allowed headers alone, and the operator's key, when it is not "", as
// x-api-key.
func operatorHeader(in http.Header, key string) http.Header {
	out := make(http.Header, len(forwardedClientHeaders)+8)
	for k, v := range in {
		if k = http.CanonicalHeaderKey(k); slices.Contains(forwardedClientHeaders, k) || strings.HasPrefix(k, "X-Stainless-") {
			out[k] = slices.Clone(v)
		}
	}
	if key != "" {
		out.Set("X-Api-Key", key)
	}
	return out
}

// returnedBackendHeaders are the headers of a backend's answer that reach a
// client in key mode: what reading the answer needs, and its request id.
// The rest describe the operator's account (its organisation, its rate
// limits) or its connection to the backend (cookies), none of them the
// client's.
var returnedBackendHeaders = []string{"Content-Type", "Content-Encoding", "Request-Id", "Retry-After", "Retry-After-Ms"}

// operatorAnswerHeader keeps in h only the headers of a backend's answer
// that reach a client in key mode.
func operatorAnswerHeader(h http.Header) {
	for k := range h {
		if !slices.Contains(returnedBackendHeaders, http.CanonicalHeaderKey(k)) {
			delete(h, k)
		}
	}
}

// apiErrorTypes are the error types of the API, which an error shaped by
// the proxy keeps when the backend's body names one.
var apiErrorTypes = []string{
	"invalid_request_error", "authentication_error", "billing_error", "permission_error", "not_found_error",
	"request_too_large", "rate_limit_error", "api_error", "overloaded_error", "timeout_error",
}

// bedrockErrorTypes are the API's error types for Bedrock's, which it
// names in x-amzn-ErrorType.
var bedrockErrorTypes = map[string]string{
	"ValidationException":           "invalid_request_error",
	"UnrecognizedClientException":   "authentication_error",
	"AccessDeniedException":         "permission_error",
	"ResourceNotFoundException":     "not_found_error",
	"ModelTimeoutException":         "timeout_error",
	"ModelErrorException":           "api_error",
	"ModelNotReadyException":        "overloaded_error",
	"ThrottlingException":           "rate_limit_error",
	"ServiceQuotaExceededException": "rate_limit_error",
	"ServiceUnavailableException":   "overloaded_error",
	"InternalServerException":       "api_error",
	"ModelStreamErrorException":     "api_error",
}

// errorTypeOf is the API's error type for a backend's error status, with
// header h and body (an SSE error event's data when status is 0): the
// type the body names in the API's shape, else Bedrock's x-amzn-ErrorType
// mapped, else the API's type for the status.
func errorTypeOf(status int, h http.Header, body []byte) string {
	var shaped struct {
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &shaped) == nil && slices.Contains(apiErrorTypes, shaped.Error.Type) {
		return shaped.Error.Type
	}
	kind, _, _ := strings.Cut(h.Get("X-Amzn-Errortype"), ":")
	if t, ok := bedrockErrorTypes[kind]; ok {
		return t
	}
	switch status {
	case http.StatusBadRequest:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusPaymentRequired:
		return "billing_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusRequestTimeout, http.StatusGatewayTimeout:
		return "timeout_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	}
	if status >= 400 && status < 500 {
		return "invalid_request_error"
	}
	return "api_error"
}

// requestIDOf is the backend's ID of the request, from its request-id
// (the API's) or x-amzn-RequestId (Bedrock's) header: "" unless it is at
// most 128 letters, digits, '-', '_', '.' or ':'.
func requestIDOf(h http.Header) string {
	id := h.Get("Request-Id")
	if id == "" {
		id = h.Get("X-Amzn-Requestid")
	}
	ok := len(id) <= 128
	for i := 0; ok && i < len(id); i++ {
		c := id[i]
		ok = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_.:", c) >= 0
	}
	if !ok {
		return ""
	}
	return id
}

// waitHeaders are the headers of a backend's error a client gets when
// the backend spends the operator's credentials: how long to wait, each
// a short decimal number (retry-after as an HTTP date is dropped).
var waitHeaders = []string{"Retry-After", "Retry-After-Ms"}

// operatorError is the answer to a backend's error status when the
// backend spends the operator's credentials: the status and the API's
// error type kept, a message of the proxy's own naming the backend, the
// request ID, and the headers of the wait, never the backend's body or
// other headers, which may echo what the proxy sent it.
func operatorError(backend string, status int, h http.Header, body []byte) (http.Header, []byte) {
	typ := errorTypeOf(status, h, body)
	out := http.Header{}
	for _, k := range waitHeaders {
		if v := h.Get(k); v != "" && len(v) <= 16 && strings.Trim(v, "0123456789.") == "" {
			out.Set(k, v)
		}
	}
	id := requestIDOf(h)
	if id != "" {
		out.Set("Request-Id", id)
	}
	msg := fmt.Sprintf("damper proxy: the backend %q answered %d %s", backend, status, typ)
	return out, errorBodyID(typ, msg, id)
}

// operatorEvent is the data of the error event that takes the place of
// a backend's own, data, as operatorError does for a status.
func operatorEvent(backend string, data []byte) []byte {
	typ := errorTypeOf(0, http.Header{}, data)
	return errorBodyID(typ, fmt.Sprintf("damper proxy: the backend %q sent a stream error event, %s", backend, typ), "")
}

// errorBodyID is an error body of the API's shape, with the API's
// request_id when id is not "".
func errorBodyID(typ, msg, id string) []byte {
	type apiError struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
	b, _ := json.Marshal(struct {
		Type      string   `json:"type"`
		Error     apiError `json:"error"`
		RequestID string   `json:"request_id,omitempty"`
	}{"error", apiError{typ, msg}, id}) // strings only: it cannot fail
	return b
}

// authConfig reads cfg's tenants and the operator's upstream key into p,
// and refuses what would spend the operator's credentials for a client
// no key names: a fallback backend, or an upstream key, with no tenant.
func (p *Proxy) authConfig(cfg ProxyConfig) error {
	if len(cfg.Tenants) == 0 {
		if name := p.d.e.FirstFallback(); name != "" {
			return fmt.Errorf("damper: NewProxy: the Damper's backend %q spends the operator's credentials: name the clients that may use it in ProxyConfig.Tenants", name)
		}
		if cfg.UpstreamAPIKey != "" {
			return errors.New("damper: NewProxy: ProxyConfig.UpstreamAPIKey is the operator's key: name the clients that may spend it in ProxyConfig.Tenants")
		}
		return nil
	}
	keys, err := newClientKeys(cfg.Tenants)
	if err != nil {
		return err
	}
	if cfg.UpstreamAPIKey == "" {
		return errors.New("damper: NewProxy: ProxyConfig.UpstreamAPIKey: required with Tenants: clients present the proxy's keys, and the upstream gets the operator's")
	}
	p.keys, p.upKey = keys, cfg.UpstreamAPIKey
	p.tenants = make([]*engine.ProxyTenant, len(keys.tenants))
	for i, t := range keys.tenants {
		if p.tenants[i], err = p.d.e.NewTenant(t); err != nil {
			return fmt.Errorf("damper: NewProxy: ProxyConfig.Tenants[%d] (%s): %w", i, t.Name, err)
		}
		// One tenant has the whole limit: its share would cost a
		// question of the store per call and change nothing.
		p.tenants[i].Gate.Shares = len(keys.tenants) > 1
	}
	return nil
}

// authenticate returns the tenant of r's key in key mode (nil in
// pass-through mode), or answers r with 401 authentication_error and
// returns false.
func (p *Proxy) authenticate(w http.ResponseWriter, r *http.Request) (*engine.ProxyTenant, bool) {
	if p.keys == nil {
		return nil, true
	}
	i, err := p.keys.authenticate(r.Header)
	if err != nil {
		writeAPIError(w, http.StatusUnauthorized, "authentication_error", err.Error(), nil)
		return nil, false
	}
	return p.tenants[i], true
}

// ceilingReached answers r with 429 rate_limit_error, and reports true,
// when t, a tenant with a daily cost ceiling, has spent it in the UTC day
// of the Damper's clock: nothing is sent, on any path. The wait headers
// say when the day ends. A store that fails answers from what this
// process knows; its error is logged.
func (p *Proxy) ceilingReached(w http.ResponseWriter, r *http.Request, t *engine.ProxyTenant) bool {
	now := p.d.e.Clock().Now()
	spent, reached, err := t.CeilingReached(r.Context(), now)
	p.d.e.LogStoreError(r.Context(), engine.PartSpend, "spent", err)
	if !reached {
		return false
	}
	reset := engine.NextUTCDay(now)
	msg := fmt.Sprintf("damper proxy: tenant %q reached its daily cost ceiling of $%s ($%s spent today, UTC): it resets at %s",
		t.Name, dollars(t.Ceiling), dollars(spent), reset.Format(time.RFC3339))
	writeAPIError(w, http.StatusTooManyRequests, "rate_limit_error", msg, retryAfter(reset.Sub(now)))
	return true
}

// dollars formats usd exactly, with at least two decimals: "5.00",
// "5.0213".
func dollars(usd float64) string {
	s := strconv.FormatFloat(usd, 'f', -1, 64)
	dot := strings.IndexByte(s, '.')
	switch {
	case dot < 0:
		return s + ".00"
	case len(s)-dot == 2:
		return s + "0"
	}
	return s
}

// Authenticated returns h served, in key mode, only to a request that
// presents a tenant's key (others get 401 authentication_error, as the
// proxy's own paths do); in pass-through mode, h itself. The damper
// command guards /metrics on the API's listener with it.
func (p *Proxy) Authenticated(h http.Handler) http.Handler {
	if p.keys == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := p.authenticate(w, r); ok {
			h.ServeHTTP(w, r)
		}
	})
}

// shapePassedError makes res, the upstream's error to a request passed
// through in key mode, the proxy's own (operatorError).
func (p *Proxy) shapePassedError(res *http.Response) {
	body, _ := io.ReadAll(io.LimitReader(res.Body, engine.MaxErrorBody))
	engine.CloseBody(res)
	h, b := operatorError(PrimaryBackend, res.StatusCode, res.Header, body)
	h.Set("Content-Type", "application/json")
	h.Set("X-Should-Retry", "false")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	res.Header, res.Body, res.ContentLength = h, io.NopCloser(bytes.NewReader(b)), int64(len(b))
	res.Trailer, res.TransferEncoding = nil, nil
}

// eventShaper is what a stream's error event from backend becomes: in key
// mode, the proxy's own (operatorEvent); nil, the event as it came, in
// pass-through mode.
func (p *Proxy) eventShaper(backend string) func([]byte) []byte {
	if p.keys == nil {
		return nil
	}
	return func(data []byte) []byte { return operatorEvent(backend, data) }
}
