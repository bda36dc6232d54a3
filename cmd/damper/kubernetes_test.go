package main

import (
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The parts of Kubernetes objects the example's test reads.
type k8sObject struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Data map[string]string `json:"data"`
	Spec struct {
		Template struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
			Spec k8sPodSpec `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
}

type k8sPodSpec struct {
	TerminationGracePeriodSeconds int            `json:"terminationGracePeriodSeconds"`
	Containers                    []k8sContainer `json:"containers"`
	Volumes                       []struct {
		Name      string `json:"name"`
		ConfigMap *struct {
			Name string `json:"name"`
		} `json:"configMap"`
	} `json:"volumes"`
}

type k8sContainer struct {
	Name    string   `json:"name"`
	Command []string `json:"command"`
	Args    []string `json:"args"`
	Env     []struct {
		Name      string `json:"name"`
		Value     string `json:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct{ Name, Key string } `json:"secretKeyRef"`
		} `json:"valueFrom"`
	} `json:"env"`
	Ports []struct {
		Name          string `json:"name"`
		ContainerPort int    `json:"containerPort"`
	} `json:"ports"`
	ReadinessProbe  *k8sProbe `json:"readinessProbe"`
	LivenessProbe   *k8sProbe `json:"livenessProbe"`
	SecurityContext struct {
		RunAsNonRoot bool `json:"runAsNonRoot"`
		RunAsUser    int  `json:"runAsUser"`
		RunAsGroup   int  `json:"runAsGroup"`
	} `json:"securityContext"`
	VolumeMounts []struct {
		Name      string `json:"name"`
		MountPath string `json:"mountPath"`
	} `json:"volumeMounts"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string `json:"path"`
		Port any    `json:"port"` // a name or a number
	} `json:"httpGet"`
}

// secretEnv returns the container's variables that come from a Secret,
// as name -> "secret/key".
func (c k8sContainer) secretEnv() map[string]string {
	out := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			out[e.Name] = e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		}
	}
	return out
}

// TestKubernetesSidecar: the sidecar example's ConfigMap is a file the
// proxy reads, with the proxy's own loader, given the variables the
// container takes from Secrets, and every name, port and path of the
// Deployment agrees with it and with the image: the args read the file
// where the ConfigMap is mounted; the admin port is admin_listen's, and
// the probes ask /readyz and /healthz there, which the admin listener
// serves; every *_env the file names comes from a Secret; the app
// reaches listen on loopback with its tenant's key; the grace period is
// above shutdown_delay plus drain_timeout; the user is the image's.
func TestKubernetesSidecar(t *testing.T) {
	cloudEnv(t, false)
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "kubernetes", "sidecar.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objects := map[string]k8sObject{}
	for _, doc := range regexp.MustCompile(`(?m)^---$`).Split(string(data), -1) {
		var o k8sObject
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatal(err)
		}
		objects[o.Kind] = o
	}
	cm, dep := objects["ConfigMap"], objects["Deployment"]
	pod := dep.Spec.Template.Spec
	var app, sidecar k8sContainer
	for _, c := range pod.Containers {
		if c.Name == "damper" {
			sidecar = c
		} else {
			app = c
		}
	}
	if sidecar.Name == "" || app.Name == "" {
		t.Fatalf("the Deployment's containers: %+v; want the app and damper", pod.Containers)
	}

	// The file, where the args read it.
	if len(sidecar.Command) > 0 || len(sidecar.Args) != 3 || sidecar.Args[0] != "proxy" || sidecar.Args[1] != "-config" {
		t.Fatalf("damper's command %q, args %q: want the image's entrypoint with proxy -config <file>", sidecar.Command, sidecar.Args)
	}
	dir, file := path.Split(sidecar.Args[2])
	var volume string
	for _, m := range sidecar.VolumeMounts {
		if path.Clean(m.MountPath) == path.Clean(dir) {
			volume = m.Name
		}
	}
	mounted := false
	for _, v := range pod.Volumes {
		mounted = mounted || v.Name == volume && v.ConfigMap != nil && v.ConfigMap.Name == cm.Metadata.Name
	}
	body, ok := cm.Data[file]
	if !mounted || !ok {
		t.Fatalf("-config %s: no ConfigMap %s with the key %s mounted there", sidecar.Args[2], cm.Metadata.Name, file)
	}

	// Every variable the file names comes from a Secret, and is set for
	// the loader.
	secrets := sidecar.secretEnv()
	for _, m := range regexp.MustCompile(`(?m)_env:\s*\[?\s*(\w+)`).FindAllStringSubmatch(body, -1) {
		if secrets[m[1]] == "" {
			t.Errorf("the file names the variable %s, which the damper container does not take from a Secret", m[1])
		}
	}
	for name := range secrets {
		t.Setenv(name, "set-for-the-test-"+name)
	}
	s, err := parseProxyFile(t, body)
	if err != nil {
		t.Fatalf("the ConfigMap's %s: %v", file, err)
	}
	// The deployment guide shows the same file.
	guide, err := os.ReadFile(filepath.Join("..", "..", "docs", "guide", "deployment.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(guide), "\n## The file\n")
	_, block, _ := strings.Cut(section, "```yaml\n")
	block, _, _ = strings.Cut(block, "```")
	if block != body {
		t.Errorf("docs/guide/deployment.md's file, under The file:\n%s\nis not the example's ConfigMap's:\n%s", block, body)
	}
	if s.store == nil || len(s.tenants) == 0 || len(s.Backends) == 0 {
		t.Errorf("the example's file: store %v, %d tenants, %d backends; want all three, as the deployment guide describes", s.store != nil, len(s.tenants), len(s.Backends))
	}

	// The admin port, its probes and its scraping.
	_, adminPort, _ := net.SplitHostPort(s.AdminListen)
	var portName string
	for _, p := range sidecar.Ports {
		if strconv.Itoa(p.ContainerPort) == adminPort {
			portName = p.Name
		}
	}
	if portName == "" {
		t.Fatalf("admin_listen %s: the container declares no port %s", s.AdminListen, adminPort)
	}
	for _, pr := range []struct {
		name, path string
		probe      *k8sProbe
	}{{"readinessProbe", "/readyz", sidecar.ReadinessProbe}, {"livenessProbe", "/healthz", sidecar.LivenessProbe}} {
		p := pr.probe
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != pr.path || fmt.Sprint(p.HTTPGet.Port) != portName && fmt.Sprint(p.HTTPGet.Port) != adminPort {
			t.Errorf("%s: %+v; want GET %s on the admin port (%s, %s)", pr.name, p, pr.path, portName, adminPort)
		}
		if !isAdminPath(pr.path) {
			t.Errorf("%s asks %s, which the admin listener does not serve", pr.name, pr.path)
		}
	}
	ann := dep.Spec.Template.Metadata.Annotations
	if ann["prometheus.io/port"] != adminPort || ann["prometheus.io/path"] != "/metrics" {
		t.Errorf("the scrape annotations %v: want port %s, path /metrics", ann, adminPort)
	}

	// The app reaches the proxy on loopback, with its tenant's key.
	if beyond, _ := beyondLoopback(s.Listen); beyond {
		t.Errorf("listen %s: the API port leaves the pod", s.Listen)
	}
	var baseURL string
	for _, e := range app.Env {
		if e.Name == "ANTHROPIC_BASE_URL" {
			baseURL = e.Value
		}
	}
	if baseURL != "http://"+s.Listen {
		t.Errorf("the app's ANTHROPIC_BASE_URL is %q, want http://%s", baseURL, s.Listen)
	}
	tenantKeys := regexp.MustCompile(`key_env:\s*\[(\w+)\]`).FindStringSubmatch(body)
	if tenantKeys == nil || app.secretEnv()["ANTHROPIC_API_KEY"] == "" || app.secretEnv()["ANTHROPIC_API_KEY"] != secrets[tenantKeys[1]] {
		t.Errorf("the app's ANTHROPIC_API_KEY comes from %q; want the Secret of the tenant's key", app.secretEnv()["ANTHROPIC_API_KEY"])
	}

	// The drain ends before the kill.
	if grace := pod.TerminationGracePeriodSeconds; float64(grace) <= (s.ShutdownDelay + s.DrainTimeout).Seconds() {
		t.Errorf("terminationGracePeriodSeconds %d: want above shutdown_delay + drain_timeout, %v", grace, s.ShutdownDelay+s.DrainTimeout)
	}

	// The image's user.
	img := parseDockerfile(t)
	sc := sidecar.SecurityContext
	if !sc.RunAsNonRoot || sc.RunAsUser != img.uid || sc.RunAsGroup != img.gid {
		t.Errorf("securityContext %+v: want runAsNonRoot as the image's %d:%d", sc, img.uid, img.gid)
	}
	if !slices.Contains(img.expose, mustAtoi(t, adminPort)) {
		t.Errorf("the image does not expose the admin port %s", adminPort)
	}
}
