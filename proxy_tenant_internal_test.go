package damper

import (
	"github.com/damper-ai/damper-go/internal/engine"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestProxyReportTenant: the report of a call the proxy makes for a tenant
// names it; that of a call with none names none.
func TestProxyReportTenant(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}`)
	}))
	defer api.Close()
	d, err := New(Policy{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewProxy(d, ProxyConfig{Upstream: api.URL})
	if err != nil {
		t.Fatal(err)
	}
	alpha, err := d.e.NewTenant(Tenant{Name: "alpha", Weight: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, ten := range []*engine.ProxyTenant{alpha, nil} {
		tenant := ""
		if ten != nil {
			tenant = ten.Name
		}
		req := httptest.NewRequest(http.MethodPost, "/v1/messages",
			strings.NewReader(`{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		var rep Report
		if status, _ := p.messages(rec, http.NewResponseController(rec), req, &rep, ten); status != 200 {
			t.Fatalf("tenant %q: status %d: %s", tenant, status, rec.Body)
		}
		if rep.Tenant != tenant || rep.Outcome != OutcomeSuccess {
			t.Errorf("tenant %q: the report's Tenant is %q, its outcome %q", tenant, rep.Tenant, rep.Outcome)
		}
	}
}
