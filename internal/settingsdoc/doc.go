// Package settingsdoc holds the test that keeps docs/configuration.md and the
// settings registry in step: every variable a package of this repository
// declares (internal/ncclenv) must be documented there. It links every
// package that declares settings, so the registry is complete.
package settingsdoc
