module github.com/limitplane/limitplane

go 1.26
