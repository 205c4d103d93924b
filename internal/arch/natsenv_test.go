package arch

import (
	"go/ast"
	"testing"
)

// assetCreators are the calls that create or change a JetStream KV bucket,
// stream or consumer: jetstream's methods, and proto's Ensure functions
// (called as proto.X). natsenv.Assets declares the job's assets (issue 24:
// "natsenv/: ... JetStream assets"); serve calls its Ensure verbs.
var (
	assetMethods = map[string]bool{
		"CreateKeyValue": true, "UpdateKeyValue": true, "CreateOrUpdateKeyValue": true,
		"CreateStream": true, "UpdateStream": true, "CreateOrUpdateStream": true,
		"CreateConsumer": true, "UpdateConsumer": true, "CreateOrUpdateConsumer": true,
	}
	protoEnsures = map[string]bool{"EnsureKV": true, "EnsureStream": true, "EnsureConsumer": true}
)

// TestServeDeclaresNoJetStreamAsset: no non-test file of package serve
// creates or updates a KV bucket, a stream or a consumer itself; natsenv's
// do (Assets, OpenLease). Before, service.go, assets.go, quarantine.go and
// lease.go each built a bucket's or the stream's configuration, twice for
// the stream and the consumers.
func TestServeDeclaresNoJetStreamAsset(t *testing.T) {
	declared := false
	for _, sf := range moduleSources(t) {
		name := sf.file.Name.Name
		if name != "serve" && name != "natsenv" {
			continue
		}
		ast.Inspect(sf.file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			pkg, _ := sel.X.(*ast.Ident)
			if !assetMethods[sel.Sel.Name] && (pkg == nil || pkg.Name != "proto" || !protoEnsures[sel.Sel.Name]) {
				return true
			}
			if name == "natsenv" {
				declared = true
				return true
			}
			t.Errorf("%s:%d: %s creates a JetStream asset: declare it in natsenv.Assets", sf.rel,
				sf.fset.Position(call.Pos()).Line, sel.Sel.Name)
			return true
		})
	}
	if !declared {
		t.Error("natsenv creates no JetStream asset: the check would check nothing")
	}
}

// leaseKeyOwners are the files that may name natsenv.LeaseKey: its
// declaration and the lease, its one writer (the holder's id under a
// compare-and-set; a second writer would break the fence's "nobody wrote
// the bucket since my revision").
var leaseKeyOwners = map[string]bool{
	"pipeline/serve/natsenv/names.go": true,
	"pipeline/serve/natsenv/lease.go": true,
}

// TestOnlyTheLeaseWritesTheLeaseKey: no other non-test file of the module
// names LeaseKey (tests may, to play another service).
func TestOnlyTheLeaseWritesTheLeaseKey(t *testing.T) {
	seen := false
	for _, sf := range moduleSources(t) {
		ast.Inspect(sf.file, func(n ast.Node) bool {
			id, ok := n.(*ast.Ident)
			if !ok || id.Name != "LeaseKey" {
				return true
			}
			if sf.rel == "pipeline/serve/natsenv/lease.go" {
				seen = true
			}
			if !leaseKeyOwners[sf.rel] {
				t.Errorf("%s:%d: names the lease key: only natsenv's Lease may write it", sf.rel, sf.fset.Position(id.Pos()).Line)
			}
			return true
		})
	}
	if !seen {
		t.Error("pipeline/serve/natsenv/lease.go names no LeaseKey: the check would check nothing")
	}
}
