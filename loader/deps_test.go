package loader

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencies guards the package contract: the loader knows neither
// NATS nor the image decoder.
func TestDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".", "./synth").Output()
	if err != nil {
		t.Skipf("go list unavailable: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"github.com/nats-io/", "github.com/mmfeed/mmfeed/imgproc", "github.com/disintegration/imaging", "github.com/daulet/tokenizers"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("loader depends on %s", dep)
			}
		}
	}
}
