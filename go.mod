module github.com/qpack-dev/qpack

go 1.26.8

require (
	github.com/dlclark/regexp2 v1.12.0 // indirect
	github.com/ebitengine/purego v0.11.3 // indirect
	github.com/nlpodyssey/safetensors v0.0.0-20250209183917-bfb01cc25f7c // indirect
	github.com/x448/float16 v0.8.4 // indirect
	golang.org/x/text v0.43.0 // indirect
)
