// Command tetherctl is the Tether operator CLI.
package main

import (
	"os"

	"github.com/tetherfleet/tether/internal/tetherctl"
)

func main() { os.Exit(tetherctl.Main(os.Args[1:], os.Stdout, os.Stderr)) }
