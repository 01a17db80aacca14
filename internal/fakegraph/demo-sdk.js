/*
 * Demo stand-in for Meta's JavaScript SDK (connect.facebook.net/en_US/sdk.js),
 * served by the fake upstream (internal/fakegraph) at GET /sdk.js for the
 * local demo (`make run` without a Meta app). It is not Meta's code and talks
 * to no server: the fake made up a phone number, a WhatsApp Business account
 * and a one-time authorization code when it served this copy (each fetch
 * makes up a new one), and wrote them into SIGNUP below.
 *
 * It plays Embedded Signup like the real SDK does for the connect page:
 * FB.init, then FB.login(callback, {config_id, response_type: 'code', ...})
 * shows a small dialog on the page ("Demo signup: connecting +1 555 0101");
 * "Connect" posts the WA_EMBEDDED_SIGNUP FINISH message (phone_number_id,
 * waba_id, business_id) to the page and calls the login callback with the
 * code, as Meta's window does; "Cancel" (or Escape) posts CANCEL and calls it
 * without one. The page then completes the connection with its own server,
 * which exchanges the code at the fake upstream.
 *
 * The messages are posted from the page's own window, so the page must
 * accept its own origin (wabarelay_connect { origin_suffix localhost }).
 * Modelled on connect/testdata/stub-sdk.js.
 */
(function () {
  'use strict';

  var SIGNUP = /*SIGNUP*/null;

  if (!SIGNUP) {
    console.error('demo sdk: no signup data');
    return;
  }

  var initialised = false;

  function post(payload) {
    window.postMessage(JSON.stringify(payload), '*');
  }

  function el(tag, className, text) {
    var e = document.createElement(tag);
    if (className) e.className = className;
    if (text) e.textContent = text;
    return e;
  }

  // A short notice next to the page's button, so the demo is visible before
  // anything is clicked.
  function notice() {
    if (document.getElementById('demo-sdk-notice')) return;
    var p = el('p', 'notice', 'Demo signup: this page uses the fake upstream, not Meta. "Connect WhatsApp" connects the made-up number ' + SIGNUP.display_phone_number + '.');
    p.id = 'demo-sdk-notice';
    var button = document.getElementById('connect-button');
    if (button && button.parentNode) {
      button.parentNode.insertBefore(p, button);
    } else if (document.body) {
      document.body.insertBefore(p, document.body.firstChild);
    }
  }

  // ask shows the demo signup dialog and calls done(true) for Connect,
  // done(false) for Cancel or Escape.
  function ask(done) {
    var d = document.createElement('dialog');
    if (typeof d.showModal !== 'function') {
      done(window.confirm('Demo signup (fake upstream, not Meta)\n\nConnect the made-up number ' + SIGNUP.display_phone_number + ' (' + SIGNUP.verified_name + ')?'));
      return;
    }
    d.id = 'demo-sdk-dialog';
    d.className = 'card card-narrow'; // the connect page's own look
    d.style.margin = 'auto'; // centred, as a modal dialog is by default
    d.setAttribute('aria-labelledby', 'demo-sdk-title');
    d.appendChild(el('h2', '', 'Demo signup'));
    d.firstChild.id = 'demo-sdk-title';
    var p = el('p', '', 'Connecting ');
    p.appendChild(el('strong', 'phone', SIGNUP.display_phone_number));
    p.appendChild(document.createTextNode(' (' + SIGNUP.verified_name + ').'));
    d.appendChild(p);
    d.appendChild(el('p', 'fineprint', 'This window stands in for Meta\u2019s Embedded Signup. The fake upstream made up this number (phone number id ' +
      SIGNUP.phone_number_id + ', WhatsApp Business account ' + SIGNUP.waba_id + '); no Facebook account is used.'));
    var actions = el('div', 'actions');
    var ok = el('button', 'btn btn-primary', 'Connect ' + SIGNUP.display_phone_number);
    ok.type = 'button';
    ok.id = 'demo-sdk-connect';
    var cancel = el('button', 'btn', 'Cancel');
    cancel.type = 'button';
    cancel.id = 'demo-sdk-cancel';
    actions.appendChild(ok);
    actions.appendChild(cancel);
    d.appendChild(actions);
    var answered = false;
    function answer(yes) {
      if (answered) return;
      answered = true;
      if (d.open) d.close();
      if (d.parentNode) d.parentNode.removeChild(d);
      done(yes);
    }
    ok.addEventListener('click', function () { answer(true); });
    cancel.addEventListener('click', function () { answer(false); });
    d.addEventListener('close', function () { answer(false); }); // Escape
    document.body.appendChild(d);
    d.showModal();
    ok.focus();
  }

  window.FB = {
    init: function (opts) {
      window.__fbInitOpts = opts;
      initialised = true;
      if (!opts || !opts.appId) console.error('demo sdk: FB.init without appId');
    },

    login: function (cb, opts) {
      opts = opts || {};
      if (!initialised) console.error('demo sdk: FB.login before FB.init');
      if (typeof cb !== 'function') return;
      if (!opts.config_id || opts.response_type !== 'code') {
        console.error('demo sdk: FB.login needs config_id and response_type "code"');
      }
      ask(function (yes) {
        // Like Meta: the message and the callback arrive separately.
        if (yes) {
          post({ type: 'WA_EMBEDDED_SIGNUP', event: 'FINISH', data: {
            phone_number_id: SIGNUP.phone_number_id, waba_id: SIGNUP.waba_id, business_id: SIGNUP.business_id } });
          setTimeout(function () {
            cb({ status: 'connected', authResponse: { code: SIGNUP.code, userID: '', expiresIn: 0, signedRequest: '' } });
          }, 50);
        } else {
          post({ type: 'WA_EMBEDDED_SIGNUP', event: 'CANCEL', data: { current_step: 'PHONE_NUMBER_SETUP' } });
          setTimeout(function () {
            cb({ status: 'unknown', authResponse: null });
          }, 50);
        }
      });
    },

    getLoginStatus: function (cb) {
      if (typeof cb === 'function') cb({ status: 'unknown', authResponse: null });
    },

    AppEvents: { logEvent: function () {}, logPageView: function () {} },
    XFBML: { parse: function () {} }
  };

  if (document.readyState === 'loading') {
    document.addEventListener('DOMContentLoaded', notice);
  } else {
    notice();
  }

  // Like the real SDK: call fbAsyncInit once the SDK is defined.
  if (typeof window.fbAsyncInit === 'function') {
    setTimeout(function () {
      if (typeof window.fbAsyncInit === 'function') window.fbAsyncInit();
    }, 0);
  }
})();
