//go:build !race

package api_test

// floodTries is how many refused calls each flood makes per route.
const floodTries = 2000
