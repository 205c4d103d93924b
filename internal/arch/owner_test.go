package arch

import (
	"go/ast"
	"go/token"
	"slices"
	"strings"
	"testing"
)

// kvOwners: for each kind of record in the job's KV bucket, the one package
// that may name its key in a call other than a read (issue 24: "no package
// outside epochs writes epoch state"; the rank positions are deliver's, which
// writes them through its Store).
var kvOwners = []struct {
	name, owner string
	names       func(ast.Expr) bool
}{
	// Before, calibrate.go (with context.Background()), assets.go and
	// resize.go wrote or deleted epoch.<e> keys too.
	{"an epoch's info (epochs.InfoKey)", "pipeline/serve/epochs/", namesEpochInfo},
	// Before, assets.go wrote all three when it recreated the bucket.
	{"a rank's KV record (deliver.Ranks)", "pipeline/serve/deliver/", namesRankState},
}

// kvReads are the calls that only read a key; any other call naming a key
// counts as a write.
var kvReads = []string{"Get", "getJSON", "GetJSON", "getInt", "GetInt"}

// TestOnlyTheOwnerWritesKVState: no non-test file outside a record's owner
// passes its key (an identifier or a literal, see namesEpochInfo and
// namesRankState) to a call other than a read, and the owner does (else the
// check would check nothing).
func TestOnlyTheOwnerWritesKVState(t *testing.T) {
	sources := moduleSources(t)
	for _, o := range kvOwners {
		seen := false
		for _, sf := range sources {
			ast.Inspect(sf.file, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok || slices.Contains(kvReads, sel.Sel.Name) {
					return true
				}
				for _, arg := range call.Args {
					switch {
					case !o.names(arg):
					case strings.HasPrefix(sf.rel, o.owner):
						seen = true
					default:
						t.Errorf("%s:%d: %s writes %s: only %s may", sf.rel,
							sf.fset.Position(call.Pos()).Line, sel.Sel.Name, o.name, o.owner)
					}
				}
				return true
			})
		}
		if !seen {
			t.Errorf("%s writes no %s: the check would check nothing", o.owner, o.name)
		}
	}
}

// namesEpochInfo reports whether expression e names an epoch's info key:
// the identifier InfoKey (epochs.InfoKey) or kvEpochInfo, or a string
// literal that starts with "epoch.".
func namesEpochInfo(e ast.Expr) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.Ident:
			found = found || x.Name == "kvEpochInfo" || x.Name == "InfoKey"
		case *ast.BasicLit:
			found = found || (x.Kind == token.STRING && strings.HasPrefix(strings.Trim(x.Value, "\"`"), "epoch."))
		}
		return !found
	})
	return found
}

// namesRankState reports whether expression e names a rank's KV record.
func namesRankState(e ast.Expr) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.Ident:
			found = found || x.Name == "KeyHanded" || x.Name == "KeyPositions" || x.Name == "RankGenKey"
		case *ast.BasicLit:
			v := strings.Trim(x.Value, "\"`")
			found = found || (x.Kind == token.STRING && (v == "handed" || v == "positions" ||
				(strings.HasPrefix(v, "rank.") && (strings.HasSuffix(v, ".gen") || strings.HasSuffix(v, ".handed")))))
		}
		return !found
	})
	return found
}

// dataPlaneChooser is the one file that may ask Config.core() which data
// plane the service runs: newDataPlane chooses the plane once (it constructs
// deliver's CorePlane or StreamPlane), and the rest of serve asks the
// deliver.DataPlane (issue 24: "one DataPlane interface instead of branches
// on the plane").
const dataPlaneChooser = "pipeline/serve/plane.go"

// TestOnlyThePlaneChoiceBranchesOnThePlane: no non-test file of
// pipeline/serve but plane.go calls core() or constructs a data plane
// (deliver.NewCorePlane, deliver.NewStreamPlane), and package deliver never
// compares a plane's name (proto.DataPlaneCore, proto.DataPlaneJetStream):
// the planes are two types, and which one runs is chosen once. Before,
// assets.go, control.go, dataplane.go, publish.go, resize.go and service.go
// branched on it.
func TestOnlyThePlaneChoiceBranchesOnThePlane(t *testing.T) {
	seen := map[string]bool{}
	for _, sf := range moduleSources(t) {
		pkg := sf.file.Name.Name
		if pkg != "serve" && pkg != "deliver" {
			continue
		}
		ast.Inspect(sf.file, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			name, line := sel.Sel.Name, sf.fset.Position(sel.Pos()).Line
			switch {
			case pkg == "serve" && (name == "core" || name == "NewCorePlane" || name == "NewStreamPlane"):
				if sf.rel == dataPlaneChooser {
					seen[name] = true
					return true
				}
				t.Errorf("%s:%d: chooses the data plane (%s): only %s may; ask the deliver.DataPlane", sf.rel, line, name, dataPlaneChooser)
			case pkg == "deliver" && (name == "DataPlaneCore" || name == "DataPlaneJetStream"):
				t.Errorf("%s:%d: deliver branches on the data plane's name (%s): the service chooses the plane", sf.rel, line, name)
			}
			return true
		})
	}
	for _, name := range []string{"core", "NewCorePlane", "NewStreamPlane"} {
		if !seen[name] {
			t.Errorf("%s has no %s: the check would check nothing", dataPlaneChooser, name)
		}
	}
}
