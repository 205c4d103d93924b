package main

import (
	"fmt"
	"runtime/debug"
)

// version and commit are set at link time by the Makefile
// (-ldflags "-X main.version=... -X main.commit=..."); without them the commit
// comes from the VCS stamp go build embeds.
var commit = ""

// versionString is what `mmfeed version` prints: version, commit (with
// "-dirty" for uncommitted changes), Go version.
func versionString(info *debug.BuildInfo, ok bool) string {
	rev, goVersion := commit, "unknown"
	if ok {
		goVersion = info.GoVersion
		if rev == "" {
			modified := false
			for _, s := range info.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					modified = s.Value == "true"
				}
			}
			if len(rev) > 12 {
				rev = rev[:12]
			}
			if rev != "" && modified {
				rev += "-dirty"
			}
		}
	}
	if rev == "" {
		rev = "unknown"
	}
	return fmt.Sprintf("mmfeed %s (commit %s, %s)", version, rev, goVersion)
}
