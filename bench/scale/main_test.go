package main

import "testing"

// TestLadder: each rank count restarts a server mid second epoch, runs
// above -single-above have one server and the big steps, and the failover
// run kills the leader mid first epoch.
func TestLadder(t *testing.T) {
	runs, err := ladder("64, 1024", 256, 12, 6, 2, 256)
	if err != nil {
		t.Fatal(err)
	}
	type got struct{ n, servers, steps, restart, kill int }
	want := []got{{64, 3, 12, 18, -1}, {1024, 1, 6, 8, -1}, {256, 3, 12, -1, 6}}
	if len(runs) != len(want) {
		t.Fatalf("got %d runs, want %d", len(runs), len(want))
	}
	for i, sc := range runs {
		if g := (got{sc.N, sc.Servers, sc.Steps, sc.RestartNATSAt, sc.KillLeaderAt}); g != want[i] {
			t.Errorf("run %d: got %+v, want %+v", i, g, want[i])
		}
	}
	if _, err := ladder("64,x", 256, 12, 6, 2, 0); err == nil {
		t.Error("a bad rank count gave no error")
	}
}
