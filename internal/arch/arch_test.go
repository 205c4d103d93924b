package arch

import (
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/mmfeed/mmfeed"

// rule is what one package may depend on.
type rule struct {
	// module lists the packages of this module the package may depend on
	// (directly or transitively), relative to the module root.
	module []string
	// deny lists outside import path prefixes it must not depend on.
	deny []string
	// imports, when set, lists the only outside import path prefixes its
	// non-test files may import directly (the standard library aside).
	imports []string
	// denyImports lists packages (the standard library's too) its non-test
	// files must not import directly, though a dependency may.
	denyImports []string
}

var (
	nats       = "github.com/nats-io/"
	natsServer = "github.com/nats-io/nats-server/"
	imaging    = "github.com/disintegration/imaging"
	xImage     = "golang.org/x/image"
	tokenizers = "github.com/daulet/tokenizers"
	arrow      = "github.com/apache/arrow-go/"
	prom       = "github.com/prometheus/"
	core       = []string{"balancer", "imgproc", "internal/ctxutil", "loader", "proto", "tokenize"}
	// harness is what the service's packages leave to bench/ and the
	// command: profiling (issue 24 moved serve's throughput harness out).
	harness = []string{"runtime/pprof"}
)

// rules is the architecture of DESIGN.md's package table, one row per package.
var rules = map[string]rule{
	"balancer":               {deny: []string{nats, imaging, xImage, "image", tokenizers, arrow, prom}}, // the report page gets thumbnails as bytes
	"loader":                 {deny: []string{nats, imaging, xImage, tokenizers, prom}},
	"loader/synth":           {module: []string{"loader"}, deny: []string{nats, tokenizers, prom}},
	"loader/synth/synthtest": {module: []string{"loader", "loader/synth"}, deny: []string{nats, tokenizers, prom}}, // tests only
	"imgproc":                {deny: []string{nats, tokenizers, arrow, prom}},
	"tokenize":               {deny: []string{nats, imaging, xImage, arrow, prom}},
	"proto": {module: []string{"internal/ctxutil"}, deny: []string{natsServer, imaging, xImage, tokenizers, prom}, // proto stays small
		imports: []string{arrow, "github.com/nats-io/nats.go", "github.com/google/flatbuffers/go"}},
	"pipeline":               {module: core, deny: []string{natsServer, prom}},
	"pipeline/serve":         {module: append([]string{"pipeline", "pipeline/serve/natsenv", "pipeline/serve/work", "pipeline/serve/httpui", "pipeline/serve/deliver", "pipeline/serve/epochs", "pipeline/serve/control", "pipeline/serve/report", "pipeline/serve/produce"}, core...), denyImports: harness},
	"pipeline/serve/deliver": {module: []string{"proto", "internal/ctxutil"}, deny: []string{natsServer, imaging, xImage, tokenizers, prom}, imports: []string{"github.com/nats-io/nats.go", "github.com/nats-io/nats.go/jetstream"}, denyImports: harness}, // the outbox, the fetch waits, the rank table, the publisher, the rank publishers, the fetch answer, the core plane's handlers (Core), its viewers and the two data planes (DataPlane): never serve, epochs or natsenv (the book is its Epochs, the assets' Ensure verbs its StreamParts); of NATS nats.go and jetstream, for the planes' subscriptions, sends and stream on the service's connection (the bucket is its Store, a rewind's plane its RewindParts; never the server, no metrics: Gauges is data)
	"pipeline/serve/natsenv": {module: []string{"proto", "internal/ctxutil"}, deny: []string{imaging, xImage, tokenizers, prom}, denyImports: harness},
	"pipeline/serve/work":    {module: append([]string{"pipeline", "pipeline/serve/natsenv"}, core...), deny: []string{prom}, denyImports: harness}, // never serve; no metrics: serve registers the planner's collectors from its numbers
	"pipeline/serve/httpui":  {module: []string{"balancer"}, deny: []string{nats, arrow}, imports: []string{prom}, denyImports: harness},            // answers from its Source, never serve
	"pipeline/serve/epochs":  {module: append([]string{"pipeline", "pipeline/serve/natsenv", "pipeline/serve/work"}, core...), deny: []string{prom}, imports: []string{}, denyImports: harness},
	// control: never serve nor deliver (its collaborators are its own interfaces); no metrics types: it counts through its Metrics
	"pipeline/serve/control": {module: append([]string{"pipeline", "pipeline/serve/natsenv", "pipeline/serve/work", "pipeline/serve/epochs"}, core...), deny: []string{prom}, imports: []string{"github.com/nats-io/nats.go"}, denyImports: harness},
	"pipeline/serve/report":  {module: append([]string{"pipeline", "pipeline/serve/epochs", "pipeline/serve/natsenv", "pipeline/serve/work"}, core...), deny: []string{prom}, imports: []string{}, denyImports: harness}, // what the service reports: never serve (the calibrator is its ObservationSource), no NATS package of its own (the standard library only outside the module), no metrics
	// produce: the publish loop; never serve (the Service is its own interfaces), no NATS package of its own and no metrics (it counts through its Metrics); outside the module Arrow's allocator and errgroup only
	"pipeline/serve/produce": {module: append([]string{"pipeline", "pipeline/serve/deliver", "pipeline/serve/epochs", "pipeline/serve/natsenv", "pipeline/serve/work"}, core...), deny: []string{prom}, imports: []string{arrow, "golang.org/x/sync/errgroup"}, denyImports: harness},
	"bench":                  {module: append([]string{"pipeline", "pipeline/serve", "pipeline/serve/natsenv", "pipeline/serve/work", "pipeline/serve/httpui", "pipeline/serve/deliver", "pipeline/serve/epochs", "pipeline/serve/control", "pipeline/serve/report", "pipeline/serve/produce", "loader/synth"}, core...)},
	"cmd/mmfeed":             {module: append([]string{"pipeline", "pipeline/serve", "pipeline/serve/natsenv", "pipeline/serve/work", "pipeline/serve/httpui", "pipeline/serve/deliver", "pipeline/serve/epochs", "pipeline/serve/control", "pipeline/serve/report", "pipeline/serve/produce", "loader/synth", "bench"}, core...)},
	"internal/arch":          {deny: []string{nats, arrow}},
	"internal/testpeer":      {},
	"internal/ctxutil":       {imports: []string{}}, // the standard library only
	"internal/testnats":      {deny: []string{arrow, prom}},
	"internal/hostile":       {module: []string{"loader"}, deny: []string{nats, prom}},
	"internal/reportcheck":   {deny: []string{nats, arrow, prom}},
	"internal/browsertest":   {deny: []string{nats, arrow, prom}},
	"internal/scalesim":      {module: []string{"proto", "internal/ctxutil"}, deny: []string{natsServer, prom}},
	"bench/scale":            {module: []string{"proto", "internal/scalesim", "internal/ctxutil"}, deny: []string{natsServer, prom}},
}

type goPackage struct {
	ImportPath string
	Dir        string
	Doc        string
	GoFiles    []string
	Imports    []string
	Deps       []string
}

func listPackages(t *testing.T) []goPackage {
	t.Helper()
	out, err := exec.Command("go", "list", "-json", module+"/...").Output()
	if err != nil {
		t.Skipf("go list unavailable: %v", err)
	}
	var pkgs []goPackage
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p goPackage
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// TestImportRules checks every package against its row of rules.
func TestImportRules(t *testing.T) {
	for _, p := range listPackages(t) {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		r, ok := rules[rel]
		if !ok {
			t.Errorf("%s has no row in the architecture table (internal/arch)", p.ImportPath)
			continue
		}
		for _, imp := range p.Imports {
			if slices.Contains(r.denyImports, imp) {
				t.Errorf("%s imports %s (denied to it: %v)", rel, imp, r.denyImports)
			}
			if r.imports != nil && !stdlib(imp) && !strings.HasPrefix(imp, module+"/") && !hasPrefix(imp, r.imports) {
				t.Errorf("%s imports %s, outside its allowed %v", rel, imp, r.imports)
			}
		}
		for _, d := range p.Deps {
			if in := strings.TrimPrefix(d, module+"/"); in != d && !slices.Contains(r.module, in) {
				t.Errorf("%s depends on %s, which its rule does not allow", rel, d)
			}
			for _, bad := range r.deny {
				if strings.HasPrefix(d, bad) {
					t.Errorf("%s depends on %s (denied: %s)", rel, d, bad)
				}
			}
		}
	}
}

func stdlib(path string) bool { return !strings.Contains(strings.Split(path, "/")[0], ".") }

func hasPrefix(s string, prefixes []string) bool {
	return slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(s, p) })
}

// TestPackageDocs requires a doc comment on every package (tailscale's
// pkgdoc_test).
func TestPackageDocs(t *testing.T) {
	for _, p := range listPackages(t) {
		if strings.TrimSpace(p.Doc) == "" {
			t.Errorf("%s has no package doc comment", p.ImportPath)
		}
	}
}
