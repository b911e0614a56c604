// Package examples holds idem's runnable examples: the programs README shows, compiled and,
// where they run on SQLite, checked against their output. It is a module of its own so that the
// core module never requires the adapters the examples use.
package examples
