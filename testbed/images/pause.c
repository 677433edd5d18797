/*
 * The sandbox ("pause") process of the local real node's pods: containerd's sandbox_image runs it as
 * each pod's first process. It holds the pod's namespaces open by doing nothing: it sleeps until
 * SIGINT or SIGTERM (then exits 0), and as PID 1 of a pod sharing its PID namespace it reaps every
 * child that exits, so no zombie is left. Built with `gcc -static` (testbed/images/pause.py), so the
 * image holds this one file.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signal_number) {
    (void)signal_number;
    _exit(0);
}

static void reap(int signal_number) {
    (void)signal_number;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

static int handle(int signal_number, void (*handler)(int), int flags) {
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_handler = handler;
    action.sa_flags = flags;
    sigemptyset(&action.sa_mask);
    return sigaction(signal_number, &action, NULL);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        puts("trainingjob-dev pause");
        return 0;
    }
    if (handle(SIGINT, stop, 0) != 0 || handle(SIGTERM, stop, 0) != 0 ||
        handle(SIGCHLD, reap, SA_NOCLDSTOP | SA_RESTART) != 0) {
        perror("pause: sigaction");
        return 1;
    }
    for (;;) {
        pause();
    }
}
