package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// checkJSONLines fails the test unless every line of out is one JSON
// object, and out holds each of want.
func checkJSONLines(t *testing.T, out string, want ...string) {
	t.Helper()
	for i, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var obj map[string]any
		if err := json.Unmarshal([]byte(line), &obj); err != nil {
			t.Errorf("line %d is not one JSON object (%v): %s", i+1, err, line)
		}
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("the log lacks %s", w)
		}
	}
	if t.Failed() {
		t.Logf("the log:\n%s", out)
	}
}

// fakeIMDS is an EC2 instance metadata service that refuses IMDSv2's
// token, so that the AWS SDK warns that it falls back to IMDSv1, and then
// gives a role's credentials.
func fakeIMDS(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/latest/api/token":
			http.Error(w, "forbidden", http.StatusForbidden)
		case "/latest/meta-data/iam/security-credentials/":
			fmt.Fprint(w, "damper-test-role")
		case "/latest/meta-data/iam/security-credentials/damper-test-role":
			fmt.Fprintf(w, `{"Code":"Success","Type":"AWS-HMAC","AccessKeyId":"AKIDDAMPERTEST","SecretAccessKey":"imds-secret","Token":"imds-token","Expiration":%q}`,
				time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestProxyProcessWritesOnlyJSON: every line the proxy process writes is
// one JSON object, the messages of the libraries it runs on included: the
// AWS SDK's warning that it falls back to IMDSv1, and the standard log
// package's message when a pass-through answer is cut (net/http's reverse
// proxy writes to it).
func TestProxyProcessWritesOnlyJSON(t *testing.T) {
	cloudEnv(t, false)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "false")
	t.Setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", fakeIMDS(t))
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, `{"data":[`)
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the answer cut after 9 of its 100 bytes
	}))
	t.Cleanup(upstream.Close)
	bedrockEndpoint := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(bedrockEndpoint.Close)

	var p *proxyProcess
	t.Cleanup(func() { // after the process's own cleanup, which stops it
		checkJSONLines(t, p.logs.String(),
			`"msg":"damper proxy: AWS SDK","message":"falling back to IMDSv1`,
			`"msg":"httputil: ReverseProxy read error during body copy: unexpected EOF"`)
	})
	p = startProxyProcess(t, "json-lines", "listen: 127.0.0.1:0\nupstream: "+upstream.URL+"\n"+tenantsYAML+"backends:\n"+
		"  - {name: bedrock, provider: bedrock, region: us-east-1, base_url: '"+bedrockEndpoint.URL+"'}\n", upstreamKeyEnv+"="+upstreamKey)
	req, _ := http.NewRequest(http.MethodGet, p.url+"/v1/models", nil)
	req.Header.Set("X-Api-Key", testKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	// The reverse proxy logs after the client's answer ends: wait for it.
	deadline := time.Now().Add(processWait)
	for !strings.Contains(p.logs.String(), "ReverseProxy read error") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
}

// TestProxyProcessRedisLogsJSON: the Redis client's own messages, such as
// its failure to dial at start, are JSON lines of the proxy's log too.
func TestProxyProcessRedisLogsJSON(t *testing.T) {
	_, closed := listening(t)
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(path, []byte("listen: 127.0.0.1:0\nstore: {address: '"+closed+"'}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "proxy", "-config", path)
	cmd.Env = append(os.Environ(), runAsDamperEnv+"=1")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitFail {
		t.Fatalf("exit: %v, want status %d:\n%s", err, exitFail, stderr.String())
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout: %q, want nothing", stdout.String())
	}
	checkJSONLines(t, stderr.String(), `"msg":"damper proxy: redis client"`, `"msg":"damper proxy: cannot start"`)
}
