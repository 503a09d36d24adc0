// Package examples holds example root modules, built into erofs images by
// build.sh (see README.md). The Go side is only its test, which builds them.
package examples
