//go:build race

package serve

import "golang.org/x/crypto/bcrypt"

// Under the race detector bcrypt runs several times slower: the cheapest
// cost keeps a connect's password check under the server's first PING
// (natsauth.go, passwordHashCost). The hashes are still real bcrypt.
func init() { passwordHashCost = bcrypt.MinCost }
