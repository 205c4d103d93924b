package serve

import (
	"fmt"
	"os"
	"testing"

	"github.com/mmfeed/mmfeed/loader"
)

// checkQuarantineOnce fails when an epoch's quarantine file holds a sample
// (id, location, reason) more than once, e.g. after a restart re-planned it.
func checkQuarantineOnce(t testing.TB, dir string, epoch int) {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("%s/quarantine-e%d.jsonl", dir, epoch))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rj, err := loader.ReadQuarantine(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(rj) == 0 {
		t.Errorf("epoch %d: empty quarantine file (the corpus has bad samples)", epoch)
	}
	seen := map[[3]string]bool{}
	for _, r := range rj {
		k := [3]string{r.ID, r.Location, r.Reason}
		if seen[k] {
			t.Errorf("epoch %d: quarantined twice: %+v", epoch, r)
		}
		seen[k] = true
	}
}
