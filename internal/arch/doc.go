// Package arch holds the module's architecture tests and nothing else: one
// table of the import rules of every package (which packages of this module
// each may depend on, directly or transitively, which outside modules it
// must not, and which packages it must not import directly), the rule that
// every package states its contract in a doc comment, and the size limits
// below. A package missing from the table fails the test, so a new
// package declares its rules when it is added.
//
// JetStream assets (natsenv_test.go): package serve creates no KV bucket,
// stream or consumer itself (natsenv.Assets declares them), and only
// natsenv's lease names the lease key.
//
// Size limits (size_test.go): no non-test Go file of the module over 600
// lines, no function over 80 (longFuncs names any exception, and only
// shrinks), and image policies compared with
// imgproc's constants, never with a string literal.
//
// Ownership (owner_test.go): only the epoch book (package
// pipeline/serve/epochs) writes or deletes an epoch's info (epoch.<e>,
// epochs.InfoKey) in the job's KV bucket, and only the data plane's choice
// (pipeline/serve/plane.go) asks which plane runs and constructs it
// (package deliver never compares a plane's name).
//
// Inputs: the output of `go list -json github.com/mmfeed/mmfeed/...` and
// the module's Go sources.
// Outputs: test failures naming the package and the offending dependency.
// Ownership and concurrency: no exported API; the tests run `go list`.
package arch
