//go:build race

package natsenv

import "golang.org/x/crypto/bcrypt"

// Under the race detector bcrypt runs several times slower: the cheapest
// cost keeps a connect's password check under the server's first PING
// (auth.go, PasswordHashCost). The hashes are still real bcrypt.
func init() { PasswordHashCost = bcrypt.MinCost }
