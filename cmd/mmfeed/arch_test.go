package main

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

type goPackage struct {
	ImportPath string
	Name       string
	Doc        string
	Deps       []string
}

func listPackages(t *testing.T) []goPackage {
	t.Helper()
	out, err := exec.Command("go", "list", "-json", "github.com/mmfeed/mmfeed/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
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

// TestPackageDocs requires a doc comment on every package (tailscale's pkgdoc_test).
func TestPackageDocs(t *testing.T) {
	for _, p := range listPackages(t) {
		if strings.TrimSpace(p.Doc) == "" {
			t.Errorf("%s has no package doc comment", p.ImportPath)
		}
	}
}

// TestDependencyDirection guards the design's package rules: the balancer stays pure
// (no NATS, no image code: the report page gets thumbnails as bytes, no tokenizers) and
// the loader does not know NATS.
func TestDependencyDirection(t *testing.T) {
	forbidden := map[string][]string{
		"github.com/mmfeed/mmfeed/balancer": {"github.com/nats-io/", "github.com/disintegration/imaging", "image", "golang.org/x/image", "github.com/daulet/tokenizers", "github.com/mmfeed/mmfeed/"},
		"github.com/mmfeed/mmfeed/loader":   {"github.com/nats-io/", "github.com/mmfeed/mmfeed/proto"},
		"github.com/mmfeed/mmfeed/tokenize": {"github.com/nats-io/", "github.com/mmfeed/mmfeed/"},
		"github.com/mmfeed/mmfeed/imgproc":  {"github.com/nats-io/", "github.com/mmfeed/mmfeed/"},
	}
	for _, p := range listPackages(t) {
		for _, bad := range forbidden[p.ImportPath] {
			for _, d := range p.Deps {
				if strings.HasPrefix(d, bad) && d != p.ImportPath {
					t.Errorf("%s imports %s", p.ImportPath, d)
				}
			}
		}
	}
}
