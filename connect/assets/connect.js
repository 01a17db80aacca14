/*
 * Connect page of wabarelay: launches Meta's WhatsApp Embedded Signup and
 * posts the result to the server.
 *
 * The configuration comes from data- attributes of #connect-app, so the page
 * needs no inline script and its Content-Security-Policy can stay strict.
 *
 * The flow: FB.login (config_id, response_type "code",
 * override_default_response_type, extras.setup) gives an authorization code
 * in its callback; the "message" event of type WA_EMBEDDED_SIGNUP gives the
 * phone number id and the business account id (event FINISH), or CANCEL /
 * ERROR. The two arrive in no fixed order. Once both the code and the ids are
 * here, the page POSTs {code, phone_number_id, waba_id} as JSON to the post
 * URL (with its same-origin cookie) and shows the answer.
 */
(function () {
  'use strict';

  // The nonce of this script, if the page has one: the SDK script gets the
  // same, so a nonce-based policy (even with 'strict-dynamic') allows it.
  var scriptNonce = (document.currentScript && document.currentScript.nonce) || '';

  // How long to wait for the ids after the code came, and for a CANCEL or
  // ERROR message after the login window closed without a code.
  var IDS_WAIT_MS = 15000;
  var CLOSE_GRACE_MS = 1500;
  var SDK_TIMEOUT_MS = 20000;
  var POST_TIMEOUT_MS = 90000;
  // After this long in the Facebook window with nothing back, the button
  // offers to start again (in case the window was blocked or lost).
  var RESTART_AFTER_MS = 20000;

  function init() {
    var app = document.getElementById('connect-app');
    var button = document.getElementById('connect-button');
    var statusEl = document.getElementById('status');
    if (!app || !button || !statusEl) {
      return;
    }
    var channelEl = document.getElementById('channel-name');
    var channelName = channelEl ? channelEl.textContent : '';

    var cfg = {
      appId: app.getAttribute('data-app-id') || '',
      configId: app.getAttribute('data-config-id') || '',
      sdkUrl: app.getAttribute('data-sdk-url') || '',
      graphVersion: app.getAttribute('data-graph-version') || '',
      postUrl: app.getAttribute('data-post-url') || '',
      originSuffix: (app.getAttribute('data-origin-suffix') || 'facebook.com').toLowerCase()
    };

    var session = null; // the signup attempt under way
    var seq = 0;
    var busy = false;
    var closed = false; // the link is dead (410) or the number is connected
    var fbInitDone = false;

    // ---- UI ---------------------------------------------------------------

    function setState(state) {
      app.setAttribute('data-state', state);
    }

    function setButton(label, opts) {
      opts = opts || {};
      button.textContent = label;
      button.hidden = !!opts.hidden;
      if (opts.busy) {
        button.setAttribute('aria-disabled', 'true');
      } else {
        button.removeAttribute('aria-disabled');
      }
    }

    // showStatus replaces the content of the live region.
    // kind: progress | success | error | cancelled
    function showStatus(kind, title, lines, detail) {
      while (statusEl.firstChild) {
        statusEl.removeChild(statusEl.firstChild);
      }
      var panel = document.createElement('div');
      panel.className = 'status-panel status-' + kind;
      panel.id = 'status-panel';
      panel.setAttribute('data-kind', kind);

      var icon = document.createElement('span');
      icon.className = 'status-icon';
      icon.setAttribute('aria-hidden', 'true');
      icon.textContent = kind === 'success' ? '✓' : kind === 'error' ? '!' : kind === 'cancelled' ? '–' : '';
      panel.appendChild(icon);

      var body = document.createElement('div');
      body.className = 'status-body';
      var t = document.createElement('p');
      t.className = 'status-title';
      t.id = 'status-title';
      t.textContent = title;
      body.appendChild(t);
      (lines || []).forEach(function (line) {
        var p = document.createElement('p');
        p.className = 'status-text';
        if (typeof line === 'string') {
          p.textContent = line;
        } else {
          line.forEach(function (part) {
            if (typeof part === 'string') {
              p.appendChild(document.createTextNode(part));
            } else {
              var span = document.createElement('span');
              span.className = part.className || '';
              span.textContent = part.text;
              p.appendChild(span);
            }
          });
        }
        body.appendChild(p);
      });
      if (detail) {
        var d = document.createElement('p');
        d.className = 'status-detail';
        d.textContent = detail;
        body.appendChild(d);
      }
      panel.appendChild(body);
      statusEl.appendChild(panel);
    }

    function progress(state, title, text) {
      setState(state);
      showStatus('progress', title, text ? [text] : []);
    }

    // finish ends the attempt with a final state and moves the focus to the
    // message, so a screen reader reads it and the next Tab reaches the button.
    function finish(state, kind, title, lines, detail, buttonOpts) {
      if (session) {
        clearTimeout(session.timer);
        clearTimeout(session.restartTimer);
        session.final = true;
      }
      busy = false;
      setState(state);
      showStatus(kind, title, lines, detail);
      var opts = buttonOpts || {};
      setButton(opts.label || 'Try again', { hidden: !!opts.hidden });
      try {
        statusEl.focus({ preventScroll: false });
      } catch (e) {
        statusEl.focus();
      }
    }

    function fail(message, detail, opts) {
      finish('error', 'error', 'The connection did not go through', [message], detail, opts);
    }

    function humanStep(step) {
      var s = String(step || '').replace(/_/g, ' ').trim().toLowerCase();
      if (!s) {
        return '';
      }
      s = s.replace(/\bwaba\b/g, 'WhatsApp Business account');
      return s.charAt(0).toUpperCase() + s.slice(1);
    }

    // ---- SDK --------------------------------------------------------------

    var sdkPromise = null;

    function sdkReady() {
      return !!(window.FB && typeof window.FB.login === 'function' && fbInitDone);
    }

    function loadSDK() {
      if (sdkPromise) {
        return sdkPromise;
      }
      sdkPromise = new Promise(function (resolve, reject) {
        var settled = false;
        var timer = null;
        function ready() {
          if (settled) {
            return;
          }
          if (!window.FB || typeof window.FB.init !== 'function') {
            return;
          }
          settled = true;
          clearTimeout(timer);
          try {
            if (!fbInitDone) {
              window.FB.init({
                appId: cfg.appId,
                autoLogAppEvents: true,
                xfbml: true,
                version: cfg.graphVersion
              });
              fbInitDone = true;
            }
            resolve(window.FB);
          } catch (e) {
            reject(e);
          }
        }
        function failed(err) {
          if (settled) {
            return;
          }
          settled = true;
          clearTimeout(timer);
          reject(err);
        }
        if (window.FB && typeof window.FB.init === 'function') {
          ready();
          return;
        }
        if (!cfg.sdkUrl) {
          failed(new Error('no SDK URL configured'));
          return;
        }
        window.fbAsyncInit = ready;
        var s = document.createElement('script');
        s.src = cfg.sdkUrl;
        s.async = true;
        if (scriptNonce) {
          s.nonce = scriptNonce;
        }
        s.onerror = function () {
          failed(new Error('the SDK script did not load'));
        };
        s.onload = function () {
          // The SDK calls fbAsyncInit itself; this is a fallback for the
          // case it was already gone or never gets called.
          setTimeout(function () {
            if (window.FB) {
              ready();
            } else {
              failed(new Error('the SDK script loaded but defined no FB'));
            }
          }, 1000);
        };
        timer = setTimeout(function () {
          failed(new Error('the SDK took too long to load'));
        }, SDK_TIMEOUT_MS);
        document.head.appendChild(s);
      });
      sdkPromise.catch(function () {
        sdkPromise = null; // let the next click try again
      });
      return sdkPromise;
    }

    function sdkFailed() {
      finish('error', 'error', 'Facebook login could not be loaded', [
        'The page could not load the login from Meta. Check your connection. If you use an ad or tracker blocker, allow connect.facebook.net on this page, then try again.'
      ]);
    }

    // ---- flow -------------------------------------------------------------

    function start() {
      if (busy || closed) {
        return;
      }
      busy = true;
      if (session) {
        clearTimeout(session.timer);
        clearTimeout(session.restartTimer);
      }
      session = { id: ++seq, code: null, ids: null, submitted: false, final: false, timer: null, restartTimer: null };
      setButton('Connecting…', { busy: true });
      if (sdkReady()) {
        // Call FB.login in the click itself, so the browser lets the
        // login window open.
        login(session);
        return;
      }
      progress('loading', 'Loading Facebook login…');
      var s = session;
      loadSDK().then(function () {
        if (s === session && !s.final) {
          login(s);
        }
      }, function () {
        if (s === session) {
          sdkFailed();
        }
      });
    }

    function login(s) {
      progress('waiting', 'Finish the steps in the Facebook window', 'Keep this page open. If no window appeared, allow pop-ups for this page and try again.');
      s.restartTimer = setTimeout(function () {
        if (s === session && !s.final && !s.submitted) {
          busy = false;
          setButton('Start again', {});
        }
      }, RESTART_AFTER_MS);
      try {
        window.FB.login(function (response) {
          onLogin(s, response);
        }, {
          config_id: cfg.configId,
          response_type: 'code',
          override_default_response_type: true,
          extras: {
            setup: {}
          }
        });
      } catch (e) {
        fail('The Facebook login could not start: ' + (e && e.message ? e.message : String(e)));
      }
    }

    function onLogin(s, response) {
      if (s !== session || s.final) {
        return;
      }
      var code = response && response.authResponse && response.authResponse.code;
      if (code) {
        s.code = String(code);
        if (maybeSubmit(s)) {
          return;
        }
        progress('waiting', 'Almost done…', 'Waiting for Facebook to report the number you chose.');
        clearTimeout(s.timer);
        s.timer = setTimeout(function () {
          if (s === session && !s.final && !s.ids) {
            fail('Facebook did not report which WhatsApp number you chose. Please try again.');
          }
        }, IDS_WAIT_MS);
        return;
      }
      // No code: the window was closed (or blocked) before the end. A CANCEL
      // or ERROR message may still be on its way and says more, so wait a
      // moment for it.
      clearTimeout(s.timer);
      s.timer = setTimeout(function () {
        if (s !== session || s.final) {
          return;
        }
        if (s.ids) {
          fail('Facebook did not hand over the authorization for the number you chose. Please try again.');
          return;
        }
        finish('cancelled', 'cancelled', 'The signup was not finished', [
          'The Facebook window was closed before the signup finished. If it did not open at all, allow pop-ups for this page. You can try again.'
        ]);
      }, CLOSE_GRACE_MS);
    }

    function originAllowed(origin) {
      var host;
      try {
        host = new URL(origin).hostname.toLowerCase();
      } catch (e) {
        return false;
      }
      var suffix = cfg.originSuffix.replace(/^\.+/, '');
      return host === suffix || host.slice(-(suffix.length + 1)) === '.' + suffix;
    }

    function onMessage(event) {
      if (!originAllowed(event.origin)) {
        return;
      }
      var msg = event.data;
      if (typeof msg === 'string') {
        try {
          msg = JSON.parse(msg);
        } catch (e) {
          return;
        }
      }
      if (!msg || typeof msg !== 'object' || msg.type !== 'WA_EMBEDDED_SIGNUP') {
        return;
      }
      var s = session;
      if (!s || s.final) {
        return;
      }
      var ev = String(msg.event || '');
      var data = msg.data && typeof msg.data === 'object' ? msg.data : {};

      if (ev.indexOf('FINISH') === 0) {
        if (!data.phone_number_id || !data.waba_id) {
          fail('The signup finished without a WhatsApp phone number. Run it again and choose a phone number (or add a new one) in the Facebook window.');
          return;
        }
        s.ids = { phone_number_id: String(data.phone_number_id), waba_id: String(data.waba_id) };
        if (!maybeSubmit(s)) {
          progress('waiting', 'Number selected', 'Waiting for the Facebook window to finish…');
        }
        return;
      }
      if (ev === 'CANCEL' && data.error_message) {
        fail(String(data.error_message), errorDetail(data));
        return;
      }
      if (ev === 'CANCEL') {
        var step = humanStep(data.current_step);
        finish('cancelled', 'cancelled', 'Signup closed', [
          step ? 'You closed the signup at step “' + step + '”; you can try again.' : 'You closed the signup before it finished; you can try again.'
        ]);
        return;
      }
      if (ev === 'ERROR') {
        fail(data.error_message ? String(data.error_message) : 'Facebook reported an error during the signup.', errorDetail(data));
      }
    }

    function errorDetail(data) {
      var parts = [];
      if (data.error_code) {
        parts.push('Error code ' + data.error_code);
      }
      if (data.session_id) {
        parts.push('session ' + data.session_id);
      }
      return parts.join(' · ');
    }

    function maybeSubmit(s) {
      if (!s.code || !s.ids || s.submitted || s.final) {
        return false;
      }
      s.submitted = true;
      clearTimeout(s.timer);
      clearTimeout(s.restartTimer);
      busy = true;
      setButton('Connecting…', { busy: true });
      submit(s);
      return true;
    }

    function submit(s) {
      progress('submitting', 'Finishing the connection…', 'Setting up your number. This takes a few seconds.');
      var controller = typeof AbortController === 'function' ? new AbortController() : null;
      var timer = setTimeout(function () {
        if (controller) {
          controller.abort();
        }
      }, POST_TIMEOUT_MS);
      var body = JSON.stringify({ code: s.code, phone_number_id: s.ids.phone_number_id, waba_id: s.ids.waba_id });
      fetch(cfg.postUrl, {
        method: 'POST',
        credentials: 'same-origin',
        cache: 'no-store',
        headers: { 'Content-Type': 'application/json', 'Accept': 'application/json' },
        body: body,
        signal: controller ? controller.signal : undefined
      }).then(function (res) {
        return res.text().then(function (text) {
          var json = null;
          try {
            json = text ? JSON.parse(text) : null;
          } catch (e) {
            json = null;
          }
          return { ok: res.ok, status: res.status, json: json };
        });
      }).then(function (r) {
        clearTimeout(timer);
        if (s !== session) {
          return;
        }
        if (r.ok) {
          succeed(r.json);
          return;
        }
        var msg = r.json && typeof r.json.error === 'string' && r.json.error ? r.json.error : 'The server answered with HTTP ' + r.status + '.';
        if (r.status === 410) {
          closed = true;
          finish('error', 'error', 'This link is invalid or has expired', [
            msg,
            'Ask the company that sent you this link for a new one.'
          ], '', { hidden: true });
          return;
        }
        fail(msg, 'HTTP ' + r.status);
      }, function (err) {
        clearTimeout(timer);
        if (s !== session) {
          return;
        }
        if (err && err.name === 'AbortError') {
          fail('The server took too long to answer. Please try again.');
        } else {
          fail('The server could not be reached. Check your connection and try again.');
        }
      });
    }

    function succeed(json) {
      var phone = json && typeof json.display_phone_number === 'string' ? json.display_phone_number : '';
      var lines = [];
      if (phone) {
        lines.push([{ text: phone, className: 'phone' }, ' is now connected' + (channelName ? ' to ' + channelName : '') + '.']);
      } else {
        lines.push('Your WhatsApp Business number is now connected' + (channelName ? ' to ' + channelName : '') + '.');
      }
      lines.push('There is nothing more to do. You can close this page.');
      closed = true;
      finish('success', 'success', 'WhatsApp is connected', lines, '', { hidden: true });
    }

    // ---- wiring -----------------------------------------------------------

    window.addEventListener('message', onMessage, false);
    button.addEventListener('click', function (e) {
      e.preventDefault();
      start();
    });
    button.hidden = false;
    // Load the SDK now, so that a click can call FB.login at once (a window
    // opened later than the click may be blocked). A failure here shows up
    // only when the person clicks.
    loadSDK().catch(function () {});
  }

  if (document.readyState === 'loading') {
    document.addEventListener('DOMContentLoaded', init);
  } else {
    init();
  }
})();
