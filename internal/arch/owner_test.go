package arch

import (
	"go/ast"
	"testing"
)

// epochStateOwner is the one file that may name kvEpochInfo in a call (a
// write or a delete of an epoch's info; reads go through getJSON, allowed
// everywhere): the epoch book (issue 24: "no package outside epochs writes
// epoch state", here a file until epochs is a package of its own).
const epochStateOwner = "pipeline/serve/epochs.go"

// TestOnlyTheEpochBookWritesEpochState: no non-test file of pipeline/serve
// but the epoch book passes an epoch.<e> key (kvEpochInfo) to a KV write or
// delete. Before, calibrate.go, assets.go and resize.go wrote or deleted
// them too, calibrate.go with context.Background().
func TestOnlyTheEpochBookWritesEpochState(t *testing.T) {
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
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name == "getJSON" || sel.Sel.Name == "Get" {
				return true
			}
			for _, arg := range call.Args {
				if !namesEpochInfo(arg) {
					continue
				}
				if sf.rel == epochStateOwner {
					seen = true
					continue
				}
				t.Errorf("%s:%d: %s writes an epoch's info (kvEpochInfo): only %s may", sf.rel,
					sf.fset.Position(call.Pos()).Line, sel.Sel.Name, epochStateOwner)
			}
			return true
		})
	}
	if !seen {
		t.Errorf("%s writes no kvEpochInfo key: the check would check nothing", epochStateOwner)
	}
}

// namesEpochInfo reports whether expression e uses the identifier kvEpochInfo
// or InfoKey (the key of an epoch's info).
func namesEpochInfo(e ast.Expr) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && (id.Name == "kvEpochInfo" || id.Name == "InfoKey") {
			found = true
		}
		return !found
	})
	return found
}
