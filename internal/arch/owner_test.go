package arch

import (
	"go/ast"
	"go/token"
	"strings"
	"testing"
)

// epochStateOwner is the one package that may name an epoch's info key in
// a call (a write or a delete of it; reads, through Get or getJSON, are
// allowed everywhere): the epoch book (issue 24: "no package outside epochs
// writes epoch state").
const epochStateOwner = "pipeline/serve/epochs/"

// TestOnlyTheEpochBookWritesEpochState: no non-test file outside
// pipeline/serve/epochs passes an epoch.<e> key (epochs.InfoKey, the
// constant kvEpochInfo, or a literal "epoch.…") to a KV write or delete.
// Before, calibrate.go, assets.go and resize.go wrote or deleted them too,
// calibrate.go with context.Background().
func TestOnlyTheEpochBookWritesEpochState(t *testing.T) {
	seen := false
	for _, sf := range moduleSources(t) {
		ast.Inspect(sf.file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name == "getJSON" || sel.Sel.Name == "Get" {
				return true
			}
			for _, arg := range call.Args {
				if !namesEpochInfo(arg) {
					continue
				}
				if strings.HasPrefix(sf.rel, epochStateOwner) {
					seen = true
					continue
				}
				t.Errorf("%s:%d: %s writes an epoch's info (epochs.InfoKey): only %s may", sf.rel,
					sf.fset.Position(call.Pos()).Line, sel.Sel.Name, epochStateOwner)
			}
			return true
		})
	}
	if !seen {
		t.Errorf("%s writes no epoch info key: the check would check nothing", epochStateOwner)
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

// dataPlaneChooser is the one file that may ask Config.core() which data
// plane the service runs: newDataPlane chooses the plane once, and the rest
// of serve asks the plane (issue 24: "one DataPlane interface instead of
// branches on the plane").
const dataPlaneChooser = "pipeline/serve/plane.go"

// TestOnlyThePlaneChoiceBranchesOnThePlane: no non-test file of
// pipeline/serve but plane.go calls core(). Before, assets.go, control.go,
// dataplane.go, publish.go, resize.go and service.go branched on it.
func TestOnlyThePlaneChoiceBranchesOnThePlane(t *testing.T) {
	seen := false
	for _, sf := range moduleSources(t) {
		if sf.file.Name.Name != "serve" {
			continue
		}
		ast.Inspect(sf.file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); !ok || sel.Sel.Name != "core" || len(call.Args) != 0 {
				return true
			}
			if sf.rel == dataPlaneChooser {
				seen = true
				return true
			}
			t.Errorf("%s:%d: branches on the data plane (core()): only %s may; ask the dataPlane", sf.rel,
				sf.fset.Position(call.Pos()).Line, dataPlaneChooser)
			return true
		})
	}
	if !seen {
		t.Errorf("%s calls no core(): the check would check nothing", dataPlaneChooser)
	}
}

// rankStateOwner is the one package that may name a rank's KV record in a
// call other than a read: the rank table (issue 24: the rank positions
// are deliver's, and it writes them through its Store).
const rankStateOwner = "pipeline/serve/deliver/"

// TestOnlyTheRankTableWritesRankState: no non-test file outside
// pipeline/serve/deliver passes a rank's KV record (deliver.KeyHanded,
// deliver.KeyPositions, deliver.RankGenKey, or a literal "handed",
// "positions", "rank.….gen" or "rank.….handed") to a call other than a
// read. Before, assets.go wrote all three when it recreated the bucket.
func TestOnlyTheRankTableWritesRankState(t *testing.T) {
	seen := false
	for _, sf := range moduleSources(t) {
		ast.Inspect(sf.file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name == "getJSON" || sel.Sel.Name == "GetJSON" || sel.Sel.Name == "Get" ||
				sel.Sel.Name == "getInt" || sel.Sel.Name == "GetInt" {
				return true
			}
			for _, arg := range call.Args {
				if !namesRankState(arg) {
					continue
				}
				if strings.HasPrefix(sf.rel, rankStateOwner) {
					seen = true
					continue
				}
				t.Errorf("%s:%d: %s writes a rank's KV record: only %s may (deliver.Ranks)", sf.rel,
					sf.fset.Position(call.Pos()).Line, sel.Sel.Name, rankStateOwner)
			}
			return true
		})
	}
	if !seen {
		t.Errorf("%s writes no rank record: the check would check nothing", rankStateOwner)
	}
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
