/*
 * The pod sandbox's process ("pause"), for the real-node test tier's local pause image
 * (scripts/provision-node.sh builds it with `gcc -static`). It does what Kubernetes'
 * build/pause/linux/pause.c does: hold the pod's namespaces, reap orphaned children (it is
 * PID 1 of the pod when the pod shares its process namespace), exit on SIGINT/SIGTERM.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int signo) {
    (void)signo;
    _exit(0);
}

static void on_child(int signo) {
    (void)signo;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        printf("pause (trainjob-operator tests)\n");
        return 0;
    }
    if (getpid() != 1) {
        fprintf(stderr, "Warning: pause should be the first process\n");
    }
    struct sigaction stop = {0};
    stop.sa_handler = on_stop;
    if (sigaction(SIGINT, &stop, NULL) < 0 || sigaction(SIGTERM, &stop, NULL) < 0) {
        return 1;
    }
    struct sigaction child = {0};
    child.sa_handler = on_child;
    child.sa_flags = SA_NOCLDSTOP;
    if (sigaction(SIGCHLD, &child, NULL) < 0) {
        return 2;
    }
    for (;;) {
        pause();
    }
    return 42;
}
