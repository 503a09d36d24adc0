//go:build race

package api_test

// floodTries is smaller under the race detector, which makes each of the
// thousands of calls many times slower; the plain run floods with more.
const floodTries = 500
